#!/usr/bin/env bash
# Builds vma_cherrypick for each supported kernel, boots that kernel under
# qemu (TCG) with a busybox initramfs holding the module and the static Go
# suite, and checks the verdict. Exits non-zero if any kernel's run fails:
# module not loading, a failed test, a timeout, or a kernel BUG/WARNING/Oops/
# bad page/RCU stall in the guest's log.
#
#   kernel/vmtest/run.sh [KERNEL_VERSION...]
#
# Environment:
#   KVERS          kernel versions (default: the two supported series)
#   VCP_BUILD      build directory (default: kernel/_build)
#   VCP_TIMEOUT    seconds one VM may run (default: 300)
#   VCP_MEM        guest memory (default: 3G)
#   VCP_TESTS      run only these suite tests (space-separated names)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
KVERS=${KVERS:-"6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64"}
[ $# -gt 0 ] && KVERS="$*"
build=${VCP_BUILD:-$top/kernel/_build}
timeout_s=${VCP_TIMEOUT:-300}
mem=${VCP_MEM:-3G}
GO=${GO:-go}

log() { printf 'kernel-test: %s\n' "$*"; }
die() { printf 'kernel-test: error: %s\n' "$*" >&2; exit 1; }

KVERS="$KVERS" "$here/install-deps.sh"

mkdir -p "$build"
log "building the static guest suite"
CGO_ENABLED=0 "$GO" build -trimpath -o "$build/vcptest" "$top/kernel/vmtest/guest"

vmlinuz_of() {
	local v=$1
	for f in "/boot/vmlinuz-$v" "/usr/lib/modules/$v/vmlinuz" "/lib/modules/$v/vmlinuz"; do
		[ -f "$f" ] && { echo "$f"; return; }
	done
	die "no kernel image for $v (looked in /boot and /usr/lib/modules)"
}

# The same patterns the guest checks in dmesg, applied to the whole console
# log, so a guest that dies before it can check is still caught.
bad_kernel_log='BUG:|WARNING:|Oops|[Bb]ad page|rcu: INFO|detected stall|RCU stall|general protection fault|Call Trace|Kernel panic|list_(add|del) corruption'

run_one() {
	local v=$1 dir=$build/$1
	local mod=$dir/module root=$dir/initramfs
	rm -rf "$mod" "$root"
	mkdir -p "$mod" "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/tmp"
	cp "$top"/kernel/vma_cherrypick/*.[chS] \
		"$top/kernel/vma_cherrypick/Makefile" "$mod/"
	log "$v: building the module"
	make -s -C "$mod" KDIR="/usr/src/linux-headers-$v" >"$dir/build.log" 2>&1 ||
		{ cat "$dir/build.log" >&2; die "$v: module build failed"; }
	if grep -E 'warning:|error:' "$dir/build.log" | grep -v 'pahole version' >&2; then
		die "$v: the module build has warnings"
	fi

	cp /bin/busybox "$root/bin/busybox"
	cp "$here/init.sh" "$root/init"
	cp "$build/vcptest" "$root/vcptest"
	cp "$mod/vma_cherrypick.ko" "$root/vma_cherrypick.ko"
	if [ -n "${VCP_TESTS:-}" ]; then
		sed -i "s|^/vcptest\$|/vcptest $VCP_TESTS|" "$root/init"
	fi
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initramfs.gz"

	local kernel console=$dir/console.log rc=0 start=$SECONDS
	kernel=$(vmlinuz_of "$v")
	log "$v: booting under qemu (TCG, timeout ${timeout_s}s)"
	timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
		-machine pc -cpu max -smp 2 -m "$mem" \
		-kernel "$kernel" -initrd "$dir/initramfs.gz" \
		-append "console=ttyS0 panic=-1 rdinit=/init loglevel=6" \
		-nographic -no-reboot </dev/null >"$console" 2>&1 || rc=$?
	tr -d '\r' <"$console" >"$console.txt"
	local took=$((SECONDS - start))

	grep -E '^(PASS|FAIL|TIMING|PSS|THP|stress:|vcptest:|  refused)' "$console.txt" | sed "s/^/  [$v] /" || true
	if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		tail -40 "$console.txt" >&2
		log "$v: FAIL: the VM did not finish within ${timeout_s}s (log: $console.txt)"
		return 1
	fi
	if grep -Eq "$bad_kernel_log" "$console.txt"; then
		grep -En "$bad_kernel_log" "$console.txt" | head -20 >&2
		log "$v: FAIL: the kernel log shows a BUG, WARNING, Oops, bad page or RCU stall (log: $console.txt)"
		return 1
	fi
	local verdict
	verdict=$(grep -E '^VCP-RESULT: ' "$console.txt" | tail -1 || true)
	if [ "$verdict" != "VCP-RESULT: PASS" ]; then
		grep -E '^(VCP-|FAIL)' "$console.txt" >&2 || tail -40 "$console.txt" >&2
		log "$v: FAIL: ${verdict:-no verdict from the guest} (log: $console.txt)"
		return 1
	fi
	log "$v: PASS in ${took}s"
}

failed=0
for v in $KVERS; do
	run_one "$v" || failed=$((failed + 1))
done
total=$(echo $KVERS | wc -w)
echo "kernel-test: $((total - failed)) passed, $failed failed"
[ "$failed" = 0 ]
