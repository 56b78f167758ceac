#!/usr/bin/env bash
# Builds the debug kernel for `make kernel-test-debug`: Debian's 6.12
# linux-source with lockdep (PROVE_LOCKING), KASAN, DEBUG_VM,
# DEBUG_PAGEALLOC (on by default) and PAGE_TABLE_CHECK, on a small config
# (tinyconfig plus what the module and the VM suite need), in a trixie root
# of its own: the kernel build needs flex, bison, bc, libelf-dev and
# libssl-dev, which the module's build root does not have.
#
# The root then looks to run.sh like the module's root: the kernel tree,
# prepared for external modules, is /usr/src/linux-headers-<release>, and its
# image /boot/vmlinuz-<release>. Prints the root's path, then the release.
#
# Cached: rebuilt only when this script changes. A build takes long on two
# shared cores (see kernel/README.md for what was measured).
#
# Environment:
#   VCP_BUILD    build directory (default: kernel/_build)
#   VCP_MIRROR   Debian mirror (default: http://deb.debian.org/debian)
#   VCP_JOBS     make -j (default: number of CPUs)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${VCP_BUILD:-$top/kernel/_build}
mirror=${VCP_MIRROR:-http://deb.debian.org/debian}
jobs=${VCP_JOBS:-$(nproc)}

log() { printf 'kernel-debug: %s\n' "$*" >&2; }
die() { printf 'kernel-debug: error: %s\n' "$*" >&2; exit 1; }

. "$top/hack/lib/mmdebstrap.sh"

root=$build/debug-root
stamp=$build/debug-root.stamp
want=$(sha256sum "$0" | cut -d' ' -f1)

mkdir -p "$build"
exec 9>"$build/.debug-root.lock"
flock 9

if [ -d "$root" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
	echo "$root"
	cat "$root/release"
	exit 0
fi

pkgs=(make gcc-14 flex bison bc libelf-dev libssl-dev cpio kmod xz-utils perl python3 linux-source-6.12)
if [ ! -d "$root" ]; then
	log "making the debug-kernel build root (${pkgs[*]})"
	rm -rf "$root.new"
	tclone_mmdebstrap --quiet --variant=required --include="$(IFS=,; echo "${pkgs[*]}")" \
		trixie "$root.new" "deb $mirror trixie main" ||
		die "mmdebstrap could not make $root.new (is $mirror reachable?)"
	mv "$root.new" "$root"
fi

# Options on top of tinyconfig: what a 64-bit SMP guest with an initramfs,
# a serial console and an NVMe swap disk needs, what the module needs
# (modules, kprobes, kallsyms), what the suite exercises, and the debugging.
cat >"$root/debug.config" <<'EOF'
CONFIG_64BIT=y
CONFIG_SMP=y
CONFIG_NR_CPUS=4
CONFIG_PRINTK=y
CONFIG_BUG=y
CONFIG_TTY=y
CONFIG_SERIAL_8250=y
CONFIG_SERIAL_8250_CONSOLE=y
CONFIG_BINFMT_ELF=y
CONFIG_BINFMT_SCRIPT=y
CONFIG_BLK_DEV_INITRD=y
CONFIG_RD_GZIP=y
CONFIG_DEVTMPFS=y
CONFIG_SHMEM=y
CONFIG_TMPFS=y
CONFIG_PROC_FS=y
CONFIG_PROC_SYSCTL=y
CONFIG_SYSFS=y
CONFIG_FUTEX=y
CONFIG_EPOLL=y
CONFIG_SIGNALFD=y
CONFIG_TIMERFD=y
CONFIG_EVENTFD=y
CONFIG_MULTIUSER=y
CONFIG_POSIX_TIMERS=y
CONFIG_PCI=y
CONFIG_BLOCK=y
CONFIG_BLK_DEV_NVME=y
CONFIG_SWAP=y
CONFIG_MODULES=y
CONFIG_MODULE_UNLOAD=y
CONFIG_KALLSYMS=y
CONFIG_KALLSYMS_ALL=y
CONFIG_KPROBES=y
CONFIG_FTRACE=y
CONFIG_UPROBE_EVENTS=y
CONFIG_DEBUG_FS=y
CONFIG_CGROUPS=y
CONFIG_MEMCG=y
CONFIG_CGROUP_FREEZER=y
CONFIG_NAMESPACES=y
CONFIG_USER_NS=y
CONFIG_TRANSPARENT_HUGEPAGE=y
CONFIG_TRANSPARENT_HUGEPAGE_ALWAYS=y
CONFIG_COMPACTION=y
CONFIG_MIGRATION=y
CONFIG_KSM=y
CONFIG_USERFAULTFD=y
CONFIG_IO_URING=y
CONFIG_FUSE_FS=y
CONFIG_HUGETLBFS=y
CONFIG_X86_INTEL_MEMORY_PROTECTION_KEYS=y
CONFIG_ADVISE_SYSCALLS=y
CONFIG_MEMBARRIER=y
CONFIG_RSEQ=y
CONFIG_DEBUG_KERNEL=y
# CONFIG_SLUB_TINY is not set
CONFIG_KASAN=y
CONFIG_KASAN_GENERIC=y
CONFIG_KASAN_OUTLINE=y
CONFIG_PROVE_LOCKING=y
CONFIG_DEBUG_ATOMIC_SLEEP=y
CONFIG_DEBUG_VM=y
CONFIG_DEBUG_PAGEALLOC=y
CONFIG_DEBUG_PAGEALLOC_ENABLE_DEFAULT=y
CONFIG_PAGE_TABLE_CHECK=y
CONFIG_PAGE_TABLE_CHECK_ENFORCED=y
CONFIG_DEBUG_LIST=y
CONFIG_DEBUG_KMEMLEAK=y
# CONFIG_DEBUG_KMEMLEAK_DEFAULT_OFF is not set
# CONFIG_DEBUG_KMEMLEAK_AUTO_SCAN is not set
# KASAN makes frames larger than the default limit; the build of the kernel
# itself must not stop on that (the module's build is checked on its own).
CONFIG_FRAME_WARN=2048
# tinyconfig makes a section mismatch an error; the stock kernels warn, and
# buildcheck-test.sh expects the warning (build-module.sh refuses it).
CONFIG_SECTION_MISMATCH_WARN_ONLY=y
CONFIG_LOCALVERSION="-vcpdebug"
EOF

log "configuring and building Debian's 6.12 source with lockdep, KASAN, DEBUG_VM, DEBUG_PAGEALLOC (-j$jobs)"
start=$SECONDS
unshare --mount --pid --fork --mount-proc="$root/proc" \
	chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C JOBS="$jobs" sh -euc '
		cd /usr/src
		if [ ! -d linux ]; then
			rm -rf linux-source-6.12
			tar -xJf linux-source-6.12.tar.xz
			mv linux-source-6.12 linux
		fi
		cd linux
		make -s CC=gcc-14 HOSTCC=gcc-14 tinyconfig
		scripts/kconfig/merge_config.sh -m .config /debug.config >/dev/null
		make -s CC=gcc-14 HOSTCC=gcc-14 olddefconfig
		missing=
		for opt in $(sed -n "s/^\(CONFIG_[A-Z0-9_]*=.*\)$/\1/p" /debug.config); do
			grep -qxF "$opt" .config || missing="$missing $opt"
		done
		for opt in $(sed -n "s/^# \(CONFIG_[A-Z0-9_]*\) is not set$/\1/p" /debug.config); do
			! grep -q "^$opt=" .config || missing="$missing $opt(unset)"
		done
		[ -z "$missing" ] || { echo "kernel-debug: not as asked in .config (a dependency is missing):$missing" >&2; exit 1; }
		make -s CC=gcc-14 HOSTCC=gcc-14 -j"$JOBS" bzImage modules_prepare
		make -s CC=gcc-14 HOSTCC=gcc-14 -j"$JOBS" modules >/dev/null
		release=$(make -s CC=gcc-14 HOSTCC=gcc-14 kernelrelease)
		# Relative, so that it resolves both inside the root (chroot) and from
		# the host (run.sh and build-module.sh look at $root$kdir/.config).
		ln -sfn linux "/usr/src/linux-headers-$release"
		mkdir -p /boot
		cp arch/x86/boot/bzImage "/boot/vmlinuz-$release"
		echo "$release" >/release
	' >&2 || die "the debug kernel did not build (see above)"
log "built $(cat "$root/release") in $((SECONDS - start))s"
echo "$want" >"$stamp"
echo "$root"
cat "$root/release"
