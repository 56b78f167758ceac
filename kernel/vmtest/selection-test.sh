#!/usr/bin/env bash
# Checks the guest's test selection check (vcp_selection_missing in
# logcheck.sh) on saved go test -test.v outputs: each file in
# testdata/selections starts with "pattern: P" (the -test.run pattern) and
# lists, as "missing: ALT", each alternative the check must find unrun;
#   ok-*       nothing missing: the stage passes;
#   missing-*  exactly the listed alternatives: the stage fails.
# With busybox on the host, the check also runs under busybox's sh and awk,
# as in the guest. Then vcp_recap, which ends a failed kernel-test, on a
# made-up failed stack stage. Exits non-zero on any output judged otherwise.
#
#   kernel/vmtest/selection-test.sh [OUTPUT...]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/logcheck.sh"
shells=(bash)
busybox=$(command -v busybox || true)
[ -n "$busybox" ] && shells+=("$busybox sh")

if [ $# -gt 0 ]; then
	outputs=("$@")
else
	outputs=("$here"/testdata/selections/*.txt)
fi
bad=0
n=0
for f in "${outputs[@]}"; do
	[ -f "$f" ] || { echo "selection-test: no output $f" >&2; exit 1; }
	name=$(basename "$f" .txt)
	pattern=$(sed -n 's/^pattern: //p' "$f" | head -1)
	[ -n "$pattern" ] || { echo "FAIL $name: no pattern: line" >&2; bad=$((bad + 1)); continue; }
	want=$(sed -n 's/^missing: //p' "$f")
	case "$name" in
	ok-*) [ -z "$want" ] || { echo "FAIL $name: an ok- output lists missing tests" >&2; bad=$((bad + 1)); continue; } ;;
	missing-*) [ -n "$want" ] || { echo "FAIL $name: a missing- output lists none" >&2; bad=$((bad + 1)); continue; } ;;
	*) echo "FAIL $name: the name says neither ok- nor missing-" >&2; bad=$((bad + 1)); continue ;;
	esac
	for sh in "${shells[@]}"; do
		n=$((n + 1))
		rc=0
		if [ "$sh" = bash ]; then
			got=$(vcp_selection_missing "$pattern" "$f") || rc=$?
		else
			got=$($sh -c '. "$1"; vcp_selection_missing "$2" "$3"' sh "$here/logcheck.sh" "$pattern" "$f") || rc=$?
		fi
		if [ -n "$want" ]; then wantrc=0; else wantrc=1; fi
		if [ "$got" = "$want" ] && [ "$rc" = "$wantrc" ]; then
			echo "ok   $name (${sh##*/}; missing: $(echo ${got:-none}))"
		else
			echo "FAIL $name (${sh##*/}): want missing [$(echo $want)] (exit $wantrc), got [$(echo $got)] (exit $rc)" >&2
			bad=$((bad + 1))
		fi
	done
done
[ "$n" -gt 0 ] || { echo "selection-test: no outputs" >&2; exit 1; }

# A failed run's recap (vcp_recap) names the stack stage's failed test and
# what it logged, and nothing of the stages that passed.
console=$(mktemp)
trap 'rm -f "$console"' EXIT
printf '%s\n' "  criu: === RUN   TestCRIUCowRestore" "  criu: --- PASS: TestCRIUCowRestore (1.00s)" \
	"  stack: === RUN   TestBundleForkCowKilled" "  stack:     cow_test.go:300: sibling died: boom" \
	"  stack: --- FAIL: TestBundleForkCowKilled (9.87s)" "  stack: FAIL" >"$console"
got=$(vcp_recap 7.3.4 "$console" "$here/../../hack/test-recap.sh")
want="kernel-test: [7.3.4] stack: 1 failed tests, with the last lines each logged (up to 12):
kernel-test: [7.3.4] stack: --- TestBundleForkCowKilled
kernel-test: [7.3.4] stack:     cow_test.go:300: sibling died: boom"
n=$((n + 1))
if [ "$got" = "$want" ]; then
	echo "ok   recap of a failed stack stage"
else
	echo "FAIL recap of a failed stack stage: got [$got]" >&2
	bad=$((bad + 1))
fi
echo "selection-test: $((n - bad)) of $n checks as named"
[ "$bad" = 0 ]
