#!/usr/bin/env bash
# Builds vma_cherrypick for each supported kernel, boots that kernel under
# qemu (KVM where a vCPU runs here, else TCG) with a busybox initramfs
# holding the module and the static Go suite, and checks the verdict. Exits non-zero if any kernel's run fails:
# a build with warnings, module not loading, a failed test, a timeout, or a
# kernel BUG/WARNING/Oops/bad page/RCU stall in the guest's log.
#
# The module is built, and the kernels are taken, from a Debian trixie root
# under the build directory (build-root.sh); the host gets only qemu,
# busybox-static, cpio and mmdebstrap from its own suite (install-deps.sh).
#
#   kernel/vmtest/run.sh [KERNEL_VERSION...]
#
# Environment:
#   KVERS          kernel versions (default: the two supported series)
#   VCP_BUILD      build directory (default: kernel/_build)
#   VCP_TIMEOUT    seconds one VM may run (default: 900)
#   VCP_MEM        guest memory (default: 3G)
#   VCP_TESTS      run only these suite tests (space-separated names)
#   VCP_CRIU_TESTS the CRIU stage's tests, a go test -run pattern over
#                  criuhooks/lazypages (default: the copy-on-write restore
#                  and a lazy restore of a tree); empty skips the stage
#   VCP_CRIU_BENCH the CRIU stage's benchmarks, a go test -bench pattern
#                  (default none; make kernel-bench sets it)
#   VCP_STACK_TESTS the stack stage's tests, a go test -run pattern over
#                  test/integration's runtime-level bundle forks, run with
#                  crun, CRIU and tclone on pure cgroup v2 (default: a fork
#                  that continues and diverges, a plan with several
#                  siblings, both copy-on-write since the module is
#                  loaded, the copy-on-write forks' own tests, and the
#                  fidelity suite on a bundle, copy-on-write, and the
#                  thaw of a source an older capture left frozen, on
#                  cgroup v2's freezer);
#                  empty skips the stage
#   VCP_SRC        module sources to test (default: kernel/vma_cherrypick)
#   VCP_ROOT       a build root that already holds the kernels and their
#                  build trees (build-debug-kernel.sh's); default: make the
#                  trixie root with build-root.sh
#   VCP_ACCEL      kvm: run the guests under KVM where
#                  kernel/vmtest/kvmprobe runs a vCPU and qemu starts with
#                  the CPU model (default: TCG, see below)
#   VCP_SLOW       N > 1 stretches the suite's time limits N times (passed to
#                  the guest as the kernel parameter vcpslow=N)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
supported="6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64"
KVERS=${KVERS:-$supported}
[ $# -gt 0 ] && KVERS="$*"
# The build root always holds every supported kernel (and any other asked
# for), so that running one kernel does not make the root again without the
# others.
root_kvers=$(printf '%s\n' $supported $KVERS | sort -u | tr '\n' ' ')
build=${VCP_BUILD:-$top/kernel/_build}
timeout_s=${VCP_TIMEOUT:-900}
mem=${VCP_MEM:-3G}
GO=${GO:-go}
src=${VCP_SRC:-$top/kernel/vma_cherrypick}

log() { printf 'kernel-test: %s\n' "$*"; }
die() { printf 'kernel-test: error: %s\n' "$*" >&2; exit 1; }

# root_copy FILE...: copies each file of the root, and every library it
# loads, into the guest's stage at the same paths. ldd runs inside the
# root, with a /proc of its own as the module build has.
root_copy() {
	local file lib
	mkdir -p "$stage"
	for file in "$@"; do
		unshare --mount --pid --fork --mount-proc="$root/proc" \
			chroot "$root" /usr/bin/ldd "$file" >"$stage/ldd.txt" || die "ldd of the root's $file failed"
		for lib in "$file" $(awk '$2 == "=>" { print $3 } $1 ~ /^\// { print $1 }' "$stage/ldd.txt"); do
			mkdir -p "$stage/root$(dirname "$lib")"
			cp -L "$root$lib" "$stage/root$lib"
		done
	done
}

"$here/install-deps.sh"
if [ -n "${VCP_ROOT:-}" ]; then
	root=$VCP_ROOT
else
	root=$(KVERS="$root_kvers" VCP_BUILD="$build" "$here/build-root.sh")
fi
append="console=ttyS0 panic=-1 rdinit=/init loglevel=6"
[ -n "${VCP_SLOW:-}" ] && append="$append vcpslow=$VCP_SLOW"

# The build check must catch what it is there to catch: a compiler warning
# and a modpost warning each fail a build (a few seconds per kernel).
KVERS="$KVERS" "$here/buildcheck-test.sh" "$root" "$build/buildcheck"

mkdir -p "$build"
log "building the static guest suite"
CGO_ENABLED=0 "$GO" build -trimpath -o "$build/vcptest" "$top/kernel/vmtest/guest"

# The CRIU stage: criuhooks/lazypages's tests, static, with the programs
# they dump and restore, run in the guest with the module loaded and the
# root's criu (TestCRIUCow* need both).
criu_tests=${VCP_CRIU_TESTS-TestCRIUCow|TestCRIULazyRestoreTree}
# The stack stage: test/integration's runtime-level bundle forks through the
# tclone binary, with the root's crun (and the libcriu it loads) and criu.
stack_tests=${VCP_STACK_TESTS-TestBundleForkContinuesAndDiverges|TestPlanServesSeveralSiblings|TestBundleForkCow|TestFidelityBundle|TestBundleForkTwinUnderWriteStorm|TestForkThawsSourceLeftFrozenByOlderVersion}
stage=$build/criu-stage
rm -rf "$stage"
if [ -n "$criu_tests" ] || [ -n "$stack_tests" ]; then
	[ -x "$root/usr/sbin/criu" ] ||
		die "the CRIU and stack stages need criu in $root (VCP_CRIU_TESTS= VCP_STACK_TESTS= skip them)"
	root_copy /usr/sbin/criu
fi
if [ -n "$criu_tests" ]; then
	log "building the CRIU stage (criuhooks/lazypages tests, memfill, lazypagesd)"
	mkdir -p "$stage/helpers"
	(cd "$top" && CGO_ENABLED=0 "$GO" test -c -trimpath -o "$stage/lazypages.test" ./criuhooks/lazypages)
	for prog in memfill lazypagesd; do
		(cd "$top" && CGO_ENABLED=0 "$GO" build -trimpath -o "$stage/helpers/$prog" "./test/cmd/$prog")
	done
	printf '%s\n' "$criu_tests" >"$stage/criu-tests"
	printf '%s\n' "${VCP_CRIU_BENCH:-}" >"$stage/criu-bench"
fi
if [ -n "$stack_tests" ]; then
	log "building the stack stage (tclone, test/integration, a busybox root)"
	tags="remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp"
	mkdir -p "$stage/stack/bin"
	(cd "$top" && CGO_ENABLED=0 "$GO" build -trimpath -tags "$tags" -o "$stage/stack/bin/tclone" ./shim/cmd/tclone)
	# The fidelity workload, static, which the copy-on-write tests run, and
	# the CRIU tests' memory filler, which answers fork(2)'s time (the 1 GiB
	# copy-on-write fork).
	(cd "$top" && CGO_ENABLED=0 "$GO" build -trimpath -o "$stage/stack/bin/workload" ./test/workload)
	(cd "$top" && CGO_ENABLED=0 "$GO" build -trimpath -o "$stage/stack/bin/memfill" ./test/cmd/memfill)
	(cd "$top" && CGO_ENABLED=0 "$GO" test -c -trimpath -tags "$tags" -o "$stage/integration.test" ./test/integration)
	printf '%s\n' "$stack_tests" >"$stage/stack-tests"
	# crun and the libcriu it loads; GNU tar and iproute2's ip too: CRIU
	# archives a container's tmpfs mounts with tar, with options busybox's
	# has not, and saves its network namespace's addresses and routes with
	# ip; and iptables-save/-restore (nft flavour), which CRIU runs on the
	# container's network namespace.
	root_copy /usr/bin/crun /usr/lib/x86_64-linux-gnu/libcriu.so.2 /usr/bin/tar /usr/bin/ip /usr/sbin/xtables-nft-multi
	for t in iptables ip6tables iptables-save ip6tables-save iptables-restore ip6tables-restore; do
		ln -sf xtables-nft-multi "$stage/root/usr/sbin/$t"
	done
	# tclone's CRIU (hack/build-criu.sh: the root's CRIU version with
	# tclone's patches, and the twin plugin): the captures dump with it,
	# as on a host. It is built on this host for the same CRIU release as
	# the root's, so it loads no library the root's criu does not, and
	# those are in the stage already: checked. The script keeps a build
	# that is up to date.
	tclone_criu=${TCLONE_CRIU_DIR:-/usr/local/lib/tclone/criu}
	"$top/hack/build-criu.sh"
	mkdir -p "$stage/root/usr/local/lib/tclone"
	cp -a "$tclone_criu" "$stage/root/usr/local/lib/tclone/criu"
	for lib in $(readelf -d "$tclone_criu/criu" "$tclone_criu/plugins/tclone_twin.so" | awk '/\(NEEDED\)/ { gsub(/[][]/, "", $NF); print $NF }' | sort -u); do
		# root_copy keeps the paths ldd gave (one of these), so a library
		# is in one of them, not both.
		[ -e "$stage/root/lib/x86_64-linux-gnu/$lib" ] || [ -e "$stage/root/usr/lib/x86_64-linux-gnu/$lib" ] ||
			[ -e "$stage/root/lib64/$lib" ] ||
			die "tclone's CRIU in $tclone_criu needs $lib, which the root's criu does not load: rebuild it (hack/build-criu.sh) for the root's CRIU release"
	done
	# A busybox root for the containers, every applet a link.
	rootfs=$stage/stack/rootfs
	mkdir -p "$rootfs/bin" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev" "$rootfs/tmp" "$rootfs/etc"
	cp /bin/busybox "$rootfs/bin/busybox"
	for applet in $(/bin/busybox --list); do
		[ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
	done
	echo 'root:x:0:0:root:/:/bin/sh' >"$rootfs/etc/passwd"
	echo 'root:x:0:' >"$rootfs/etc/group"
fi

# The accelerator: TCG unless VCP_ACCEL=kvm asks for KVM. Nested under these
# machines' hypervisor, /dev/kvm can run a probe's vCPU, and qemu can start
# with the host's CPU model (once IA32_ARCH_CAPABILITIES is left out, which
# qemu otherwise aborts on), and still the guest kernel dies on its first
# instructions (a KVM internal error) and qemu waits for the timeout; so
# KVM is asked for, not guessed. Under KVM the probe runs a vCPU first.
mkdir -p "$build"
accel=tcg
qemu_cpu=(-machine pc -cpu max)
accel_why="the default; VCP_ACCEL=kvm asks for KVM"
if [ "${VCP_ACCEL:-}" = kvm ]; then
	(cd "$top" && CGO_ENABLED=0 "$GO" build -o "$build/kvmprobe" ./kernel/vmtest/kvmprobe) || die "building kernel/vmtest/kvmprobe failed"
	probe=$(timeout 20 "$build/kvmprobe" 2>&1) || die "VCP_ACCEL=kvm: no KVM here: ${probe:-the probe vCPU did not stop within 20 s}"
	for cpu in host host,arch-capabilities=off; do
		rc=0
		# Still waiting to start its vCPU after 3 s: qemu can. (In a
		# subshell: the shell's word on a qemu that aborts is not wanted.)
		(timeout 3 qemu-system-x86_64 -machine pc,accel=kvm -cpu "$cpu" -S -nodefaults -display none -serial none -monitor none) </dev/null >/dev/null 2>&1 || rc=$?
		if [ "$rc" = 124 ]; then
			accel=kvm
			qemu_cpu=(-machine pc,accel=kvm -cpu "$cpu")
			accel_why="VCP_ACCEL=kvm; -cpu $cpu"
			break
		fi
	done
	[ "$accel" = kvm ] || die "VCP_ACCEL=kvm: qemu cannot start a KVM guest with the host's CPU model here"
fi
log "qemu runs the guests under $accel ($accel_why)"

vmlinuz_of() {
	local v=$1
	for f in "$root/boot/vmlinuz-$v" "$root/usr/lib/modules/$v/vmlinuz"; do
		[ -f "$f" ] && { echo "$f"; return; }
	done
	die "no kernel image for $v in $root (looked in /boot and /usr/lib/modules)"
}

# The same check the guest makes on dmesg, applied to the whole console
# log, so a guest that dies before it can check is still caught.
. "$here/logcheck.sh"
# The boot-again rule: which consoles show a fault of the emulator's alone.
. "$here/bootagain.sh"

# The modules CRIU's feature detection needs, which the cloud kernels build
# as modules: nf_tables (CRIU 4.1 fails without it), the socket diag
# modules, tun; and nf_conntrack_netlink for the stack stage: CRIU dumps
# every network namespace's conntrack table, and without ctnetlink the
# kernel (which cannot load it by itself here: no modprobe) answers EINVAL
# ("-22 reported by netlink"). criu_modules KERNEL DIR decompresses them, each after what it
# depends on (modules.dep), into DIR and lists them in DIR/list in load order;
# a module built in is not there, and needs no loading.
criu_modules() {
	local v=$1 out=$2 mods=$root/usr/lib/modules/$1
	local want="nf_tables tcp_diag udp_diag unix_diag netlink_diag af_packet_diag tun veth nf_conntrack_netlink"
	[ -f "$mods/modules.dep" ] || die "$v: no modules.dep in $mods (the root lacks this kernel's modules package)"
	mkdir -p "$out"
	: >"$out/list"
	local -A done=()
	add() {
		local rel=$1 dep
		[ -n "${done[$rel]:-}" ] && return
		done[$rel]=1
		for dep in $(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$mods/modules.dep"); do
			add "$dep"
		done
		local name
		name=$(basename "$rel")
		name=${name%%.ko*}
		case "$rel" in
		*.xz) xz -dc "$mods/$rel" >"$out/$name.ko" ;;
		*.zst) zstd -qdc "$mods/$rel" >"$out/$name.ko" ;;
		*) cp "$mods/$rel" "$out/$name.ko" ;;
		esac
		echo "$name" >>"$out/list"
	}
	local m rel
	for m in $want; do
		rel=$(awk -F: -v m="$m" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); if (n == m) { print $1; exit } }' "$mods/modules.dep")
		if [ -z "$rel" ]; then
			grep -q "/$m\.ko" "$mods/modules.builtin" || die "$v: module $m is neither in modules.dep nor built in"
			continue
		fi
		add "$rel"
	done
}

run_one() {
	local v=$1 dir=$build/$1
	local mod=$dir/module initrd=$dir/initramfs
	rm -rf "$mod" "$initrd"
	mkdir -p "$initrd/bin" "$initrd/proc" "$initrd/sys" "$initrd/dev" "$initrd/tmp"
	log "$v: building the module (trixie root's gcc-14 and headers)"
	"$here/build-module.sh" "$root" "$v" "$src" "$mod" ||
		die "$v: the module did not build cleanly"
	# The same module built to believe this kernel's series untested, for
	# the allowlist check in init.sh.
	local untested=$dir/untested-src
	rm -rf "$untested"
	mkdir -p "$untested"
	cp "$src"/*.[chS] "$src/Makefile" "$untested/"
	echo 'ccflags-y += -DVCP_PRETEND_UNTESTED' >>"$untested/Makefile"
	"$here/build-module.sh" "$root" "$v" "$untested" "$dir/untested" ||
		die "$v: the untested-series build of the module failed"

	cp /bin/busybox "$initrd/bin/busybox"
	cp "$here/init.sh" "$initrd/init"
	cp "$build/vcptest" "$initrd/vcptest"
	cp "$mod/vma_cherrypick.ko" "$initrd/vma_cherrypick.ko"
	cp "$dir/untested/vma_cherrypick.ko" "$initrd/vcp_untested.ko"
	cp "$here/logcheck.sh" "$initrd/logcheck.sh"
	if [ -d "$stage" ]; then
		cp -a "$stage/root/." "$initrd/"
		if [ -f "$stage/lazypages.test" ]; then
			cp "$stage/lazypages.test" "$stage/criu-tests" "$stage/criu-bench" "$initrd/"
			cp -a "$stage/helpers" "$initrd/helpers"
		fi
		if [ -d "$stage/stack" ]; then
			cp -a "$stage/stack" "$initrd/stack"
			cp "$stage/integration.test" "$stage/stack-tests" "$initrd/"
		fi
		criu_modules "$v" "$initrd/criu-modules"
	fi
	if [ -n "${VCP_TESTS:-}" ]; then
		sed -i "s|^/vcptest\$|/vcptest $VCP_TESTS|" "$initrd/init"
	fi
	(cd "$initrd" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initramfs.gz"

	local kernel console=$dir/console.log rc start=$SECONDS attempt
	kernel=$(vmlinuz_of "$v")
	for attempt in 1 2 3; do
		rc=0
		# A sparse disk for swap, on an NVMe controller (built into the kernel).
		rm -f "$dir/swap.img"
		truncate -s 512M "$dir/swap.img"
		log "$v: booting under qemu ($accel, timeout ${timeout_s}s)"
		timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
			"${qemu_cpu[@]}" -smp 2 -m "$mem" \
			-kernel "$kernel" -initrd "$dir/initramfs.gz" \
			-drive "file=$dir/swap.img,if=none,id=swap,format=raw" \
			-device nvme,drive=swap,serial=vcpswap \
			-append "$append" \
			-nographic -no-reboot </dev/null >"$console" 2>&1 || rc=$?
		tr -d '\r' <"$console" >"$console.txt"
		rm -f "$dir/swap.img"
		if [ "$attempt" != 3 ] && emulator_fault "$console.txt"; then
			vcp_log_bad "$console.txt" | head -5 >&2
			cp "$console.txt" "$dir/console.crash-$attempt.txt"
			log "$v: the kernel took an emulator int3 Oops, crashed before init ran, or stalled while the host starved the emulator (log: $dir/console.crash-$attempt.txt); booting it again (attempt $((attempt + 1)) of 3)"
			continue
		fi
		if vcp_log_bad "$console.txt" >/dev/null && [ -n "$(vcp_bootagain_blockers "$console.txt")" ]; then
			log "$v: not booted again: the log shows more than a fault of the emulator's:"
			vcp_bootagain_blockers "$console.txt" | head -10 >&2
		fi
		break
	done
	local took=$((SECONDS - start))

	grep -E '^(PASS|FAIL|TIMING|PSS|THP|stress:|vcptest:|VCP-(ALLOWLIST|SWAP|BTF|KMEMLEAK|CRIU|UNLOAD|STACK|PERF)|  )' "$console.txt" | sed "s/^/  [$v] /" || true
	if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		tail -40 "$console.txt" >&2
		log "$v: FAIL: the VM did not finish within ${timeout_s}s (log: $console.txt)"
		return 1
	fi
	if vcp_log_bad "$console.txt" >/dev/null; then
		vcp_log_bad "$console.txt" | head -20 >&2
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
	log "$v: PASS in ${took}s ($accel)"
}

failed=0 recaps=
for v in $KVERS; do
	if ! run_one "$v"; then
		failed=$((failed + 1))
		recaps="$recaps $v"
	fi
done
for v in $recaps; do
	vcp_recap "$v" "$build/$v/console.log.txt" "$top/hack/test-recap.sh"
done
total=$(echo $KVERS | wc -w)
echo "kernel-test: $((total - failed)) passed, $failed failed"
[ "$failed" = 0 ]
