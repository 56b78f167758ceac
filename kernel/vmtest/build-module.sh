#!/usr/bin/env bash
# Builds an out-of-tree module inside the trixie root (build-root.sh), with
# that root's gcc-14 against that root's headers for one kernel, and fails on
# any compiler or modpost diagnostic.
#
#   kernel/vmtest/build-module.sh ROOT KERNEL_VERSION SRC_DIR OUT_DIR
#
# SRC_DIR holds the module's sources and kbuild Makefile (as
# kernel/vma_cherrypick does). OUT_DIR receives build.log and the .ko files.
# Exit status: 0 clean build, 1 failed build, 2 built with diagnostics.
set -euo pipefail

[ $# -eq 4 ] || { echo "usage: $0 ROOT KERNEL_VERSION SRC_DIR OUT_DIR" >&2; exit 64; }
root=$1 v=$2 src=$3 out=$4

log() { printf 'kernel-build: %s\n' "$*" >&2; }

kdir=/usr/src/linux-headers-$v
[ -f "$root$kdir/.config" ] || { log "$v: no headers at $root$kdir; run kernel/vmtest/build-root.sh with KVERS including $v"; exit 1; }

mkdir -p "$root/build" "$out"
work=$(mktemp -d "$root/build/module.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$src"/*.[chS] "$src/Makefile" "$work/"

# kbuild's objtool reads /proc; a private mount and PID namespace gives the
# root one that disappears with the build. LC_ALL=C keeps the diagnostics in
# the English the check below matches.
rc=0
unshare --mount --pid --fork --mount-proc="$root/proc" \
	chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C \
	make -s -C "/build/${work##*/}" KDIR="$kdir" >"$out/build.log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
	cat "$out/build.log" >&2
	log "$v: the module build failed (make exited $rc; log: $out/build.log)"
	exit 1
fi

# gcc prints "warning:"/"error:", modpost "WARNING: modpost: ..." (section
# mismatches, unresolved symbols). The pahole notice is about BTF, which this
# module does not generate.
diag='warning:|error:|WARNING:|ERROR:'
if grep -E "$diag" "$out/build.log" | grep -v 'pahole version' >&2; then
	log "$v: the module build has warnings (log: $out/build.log)"
	exit 2
fi
cp "$work"/*.ko "$out/"
