#!/bin/bash
# bench-md.sh OUTPUT MARKDOWN: writes the copy-on-write section of
# BENCHMARKS.md from the output of a `make kernel-bench` run (run.sh's
# summary: the module's TIMING lines and BenchmarkCRIUCow's metrics, per
# kernel), replacing the section the file has, or inserting it before
# "## Not measured, failures". `make bench` keeps the section as it is.
set -euo pipefail
out=$1 md=$2
top=$(cd "$(dirname "$0")/../.." && pwd)
begin='<!-- kernel-bench: begin -->'
end='<!-- kernel-bench: end -->'

# One "kernel key value" line per figure.
figures=$(awk '
	match($0, /^  \[([^]]+)\] /) {
		k = substr($0, 4, RLENGTH - 5); rest = substr($0, RLENGTH + 1)
		if (rest ~ /^TIMING 1GiB (snapshot|cherrypick)=/) {
			split(rest, f, /[ =]|ms/)
			print k, "mod-" f[3], f[4]; print k, "mod-" f[3] "-fork", f[7]
		}
		if (rest ~ /criu: BenchmarkCRIUCow\//) {
			sub(/.*BenchmarkCRIUCow\//, "", rest)
			n = split(rest, f, /[ \t]+/)
			name = f[1]; sub(/-[0-9]+$/, "", name)
			for (i = 3; i + 1 <= n; i += 2) print k, name "/" f[i + 1], f[i]
		}
		if (rest ~ /^VCP-CRIU: Version:/) { print k, "criu", $NF }
	}' "$out")
[ -n "$figures" ] || { echo "bench-md: no figures in $out" >&2; exit 1; }
kernels=$(awk '{ print $1 }' <<<"$figures" | sort -u)
get() { awk -v k="$1" -v n="$2" '$1 == k && $2 == n { print $3; exit }' <<<"$figures"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "–"; else printf "%.2f", a / b }'; }
short() { sed -E 's/^([0-9]+\.[0-9]+).*/\1/' <<<"$1"; }

section=$(
	echo "$begin"
	echo "## Copy-on-write in the VM"
	echo
	echo "Written by \`make kernel-bench\` at $(git -C "$top" describe --always --dirty) on $(date -u +%Y-%m-%d): qemu TCG (no KVM), 2 vCPUs, 3 GiB,"
	echo "Debian's cloud kernels with vma_cherrypick loaded, CRIU $(get "$(head -1 <<<"$kernels")" criu) in the guest. One run, every figure of a"
	echo "column from the same VM; TCG times are not bare-metal times, only their ratios mean something. The source is one memfill"
	echo "process (criuhooks/lazypages' BenchmarkCRIUCow): its pause is the longest wait of its 1 ms loop across the dump; the first"
	echo "answer is from the restore's start. \`copy\`: stock CRIU dump and restore. \`lazy\`: the copying dump, restored lazily by"
	echo "tclone's daemon. \`cow\`: a lazy dump with module snapshots, pages shared at pre-resume."
	echo
	printf '| |'
	for k in $kernels; do printf ' %s, 1 MiB | %s, 1 GiB |' "$(short "$k")" "$(short "$k")"; done
	echo
	printf '| ---'; for _ in $kernels; do printf ' | ---: | ---:'; done; echo ' |'
	row() {
		printf '| %s |' "$1"
		for k in $kernels; do printf ' %s | %s |' "$(get "$k" "1MiB/$2")" "$(get "$k" "1024MiB/$2")"; done
		echo
	}
	row "source pause, cow (ms)" cow-pause-ms
	row "source pause, copy and lazy (ms)" copy-pause-ms
	row "fork() of the source (ms)" fork-ms
	row "first answer, cow (ms)" cow-first-answer-ms
	row "first answer, lazy (ms)" lazy-first-answer-ms
	row "first answer, copy (ms)" copy-first-answer-ms
	row "cow sibling PSS / RSS" pss/rss
	echo
	printf '| |'; for k in $kernels; do printf ' %s |' "$(short "$k")"; done; echo
	printf '| ---'; for _ in $kernels; do printf ' | ---:'; done; echo ' |'
	for n in "cow-pause-1-ms:cow pause, 1 process (ms)" "cow-pause-16-ms:cow pause, 16 processes (ms)" "slope-ms/proc:cow pause per extra process (ms)"; do
		printf '| %s |' "${n#*:}"
		for k in $kernels; do printf ' %s |' "$(get "$k" "slope/${n%%:*}")"; done
		echo
	done
	for n in snapshot cherrypick; do
		printf '| module: %s of 1 GiB / fork() of it (ms) |' "$n"
		for k in $kernels; do printf ' %s / %s |' "$(get "$k" "mod-$n")" "$(get "$k" "mod-$n-fork")"; done
		echo
	done
	echo
	echo "Targets (issue: copy-on-write fork):"
	echo
	printf '| target |'; for k in $kernels; do printf ' %s |' "$(short "$k")"; done; echo
	printf '| ---'; for _ in $kernels; do printf ' | ---'; done; echo ' |'
	verdict() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/) print "not measured"; else if (a + 0 <= b + 0) printf "%.4g ≤ %.4g: met", a, b; else printf "%.4g > %.4g: not met", a, b }'; }
	printf '| pause at 1 GiB ≤ pause at 1 MiB + 3 × fork() of 1 GiB |'
	for k in $kernels; do
		bound=$(awk -v p="$(get "$k" 1MiB/cow-pause-ms)" -v f="$(get "$k" 1024MiB/fork-ms)" 'BEGIN { if (p != "" && f != "") print p + 3 * f }')
		printf ' %s |' "$(verdict "$(get "$k" 1024MiB/cow-pause-ms)" "$bound")"
	done
	echo
	printf '| sibling PSS ≤ 0.55 × RSS at 1 GiB |'
	for k in $kernels; do printf ' %s |' "$(verdict "$(get "$k" 1024MiB/pss/rss)" 0.55)"; done
	echo
	printf '| first command at 1 GiB ≤ 1.3 × at 1 MiB |'
	for k in $kernels; do
		printf ' %s |' "$(verdict "$(ratio "$(get "$k" 1024MiB/cow-first-answer-ms)" "$(get "$k" 1MiB/cow-first-answer-ms)")" 1.3)"
	done
	echo
	printf '| pause slope ≤ 2 ms/process |'
	for k in $kernels; do printf ' %s |' "$(verdict "$(get "$k" slope/slope-ms/proc)" 2)"; done
	echo
	echo "$end"
)

tmp=$(mktemp "$md.XXXXXX")
if grep -qF "$begin" "$md"; then
	awk -v b="$begin" -v e="$end" -v s="$section" '
		$0 == b { print s; skip = 1; next }
		$0 == e { skip = 0; next }
		!skip' "$md" >"$tmp"
else
	awk -v s="$section" '/^## Not measured, failures/ && !done { print s; print ""; done = 1 } { print }' "$md" >"$tmp"
fi
mv "$tmp" "$md"
echo "bench-md: wrote the copy-on-write section of $md"
