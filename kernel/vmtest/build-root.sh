#!/usr/bin/env bash
# Makes the Debian trixie root the vma_cherrypick module is built in, and
# that the kernels qemu boots come from: gcc-14, make, and for each kernel
# its headers and its boot image, installed by apt inside the root; and
# criu, crun, libcriu2, iproute2 and iptables, which run.sh copies into the
# guest with the libraries they need, for the copy-on-write tests with CRIU
# and the runtime-level forks (the stack stage).
#
# criu and libcriu2 come from forky (4.2.1), as on the hosts
# (hack/setup-host.sh): tclone refuses CRIU < 4.2 on kernels >= 6.16
# (runtime/criucheck: CRIU issue #2705), so trixie's 4.1.1 could not fork a
# container on 7.x. Forky is only a source for what is asked of it by name
# (criu/forky): trixie is the default release, and apt takes from forky just
# the libraries that criu needs newer (libnl, libcompel). A testing suite's
# Release file is valid for a week only, and mirrors here serve forky's past
# that date (apt then refuses the whole update), so forky's, and only
# forky's, is taken without that check: its signature is still checked.
#
# Nothing is installed into the host. Trixie's kernel headers and kbuild need
# trixie's libelf1t64, which conflicts with the libelf1 that a bookworm host's
# gdb and linux-perf depend on; inside this root that conflict does not exist.
#
# Cached: the root is rebuilt only when the package list (kernel versions
# included) or this recipe changes; a stamp beside the root records what it
# was made from. A cold build takes about a minute and a half here.
#
#   kernel/vmtest/build-root.sh      prints the root's path on stdout
#
# Environment:
#   KVERS        kernel versions (default: the two the suite supports)
#   VCP_BUILD    build directory (default: kernel/_build)
#   VCP_MIRROR   Debian mirror (default: http://deb.debian.org/debian)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
KVERS=${KVERS:-"6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64"}
build=${VCP_BUILD:-$top/kernel/_build}
mirror=${VCP_MIRROR:-http://deb.debian.org/debian}

log() { printf 'kernel-root: %s\n' "$*" >&2; }
die() { printf 'kernel-root: error: %s\n' "$*" >&2; exit 1; }

. "$top/hack/lib/mmdebstrap.sh"

# Bump when the recipe below changes in a way the package list does not show.
recipe=2
root=$build/trixie-root
stamp=$build/trixie-root.stamp

# The package that holds a kernel's boot image. From 7.x Debian splits the
# image out of linux-image-* into linux-binary-*, which has no boot hooks,
# and the modules into linux-modules-* (the CRIU stage loads a few).
# 6.12's headers depend on linux-image-* itself, whose dependency on an
# initramfs generator is met by tiny-initramfs (a few KB, where
# initramfs-tools would build a 30 MB initramfs nobody boots).
image_pkg() {
	case "$1" in
	6.*) echo "linux-image-$1" ;;
	*) echo "linux-binary-$1 linux-modules-$1" ;;
	esac
}

pkgs=(make gcc-14 criu/forky libcriu2/forky crun iproute2 iptables)
for v in $KVERS; do
	pkgs+=("linux-headers-$v")
	read -ra image <<<"$(image_pkg "$v")"
	pkgs+=("${image[@]}")
	case "$v" in 6.*) pkgs+=(tiny-initramfs) ;; esac
done
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
sources=("deb $mirror trixie main" "deb $mirror trixie-backports main" "deb [check-valid-until=no] $mirror forky main")
want=$(printf 'recipe %s\n' "$recipe"; printf 'source %s\n' "${sources[@]}"; printf 'package %s\n' "${pkgs[@]}")

mkdir -p "$build"
# One builder at a time; a second caller waits and then finds the root made.
exec 9>"$build/.trixie-root.lock"
flock 9

if [ -d "$root" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
	echo "$root"
	exit 0
fi

# A directory is only removed when nothing is mounted below it: mmdebstrap
# mounts /proc, /sys and /dev inside the root while it runs, and a run that
# was killed could leave them behind.
remove_root() {
	local dir=$1
	[ -e "$dir" ] || return 0
	local real
	real=$(realpath "$dir")
	if awk -v d="$real/" '{ if (index($5 "/", d) == 1) found = 1 } END { exit !found }' /proc/self/mountinfo; then
		die "$real has mounts below it (a killed build?); unmount them (grep $real /proc/self/mountinfo) and run again"
	fi
	rm -rf "$dir"
}

log "making the trixie build root (${pkgs[*]}); about a minute and a half"
start=$SECONDS
rm -f "$stamp"
remove_root "$root.new"
tclone_mmdebstrap --quiet --variant=required --aptopt='APT::Default-Release "trixie"' --include="$(IFS=,; echo "${pkgs[*]}")" \
	trixie "$root.new" "${sources[@]}" ||
	die "mmdebstrap could not make the trixie root in $root.new (see its messages above; is $mirror reachable?)"
remove_root "$root"
mv "$root.new" "$root"
printf '%s\n' "$want" >"$stamp"
log "made $root in $((SECONDS - start))s"
echo "$root"
