#!/usr/bin/env bash
# Installs what the vma_cherrypick VM test needs on a Debian host (root):
# the two cloud kernels it is tested on, their headers (which bring the
# compiler those kernels were built with), qemu, busybox and cpio.
#
# Idempotent: nothing is fetched when everything is already installed, so a
# second `make kernel-test` spends no time here.
#
# Environment:
#   KVERS   the kernel versions to install (default: the two the suite supports)
set -euo pipefail

log() { printf 'kernel-deps: %s\n' "$*"; }
die() { printf 'kernel-deps: error: %s\n' "$*" >&2; exit 1; }

KVERS=${KVERS:-"6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64"}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# The packages that hold a kernel's boot image. Only qemu reads it: the host
# never boots these kernels. From 7.x Debian splits the image out of
# linux-image-* into linux-binary-*; installing that alone avoids the
# linux-image package's boot hooks, which need a newer run-parts than
# bookworm's debianutils (they fail with "run-parts: missing operand") and
# would only build an initramfs nobody uses. 6.12's headers depend on its
# linux-image package, so there the full package is installed.
image_pkg() {
	case "$1" in
	6.*) echo "linux-image-$1" ;;
	*) echo "linux-binary-$1" ;;
	esac
}

missing=()
for p in qemu-system-x86 busybox-static cpio; do installed "$p" || missing+=("$p"); done
for v in $KVERS; do
	for p in "$(image_pkg "$v")" "linux-headers-$v"; do installed "$p" || missing+=("$p"); done
done
[ ${#missing[@]} -eq 0 ] && exit 0

[ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}); run as root so they can be installed"
command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and this is not a Debian host"
export DEBIAN_FRONTEND=noninteractive

# The suites are added as hack/setup-host.sh adds them (same files, same
# pins), so the two scripts never define a suite twice.
. "$(cd "$(dirname "$0")/../.." && pwd)/hack/lib/apt-suites.sh"

# trixie at 100 (as hack/setup-host.sh sets it); backports below it at 50, so
# a package that exists in both never moves to the backports build.
tclone_have_suite trixie || tclone_add_suite trixie trixie 100 || true
tclone_have_suite trixie-backports || tclone_add_suite trixie-backports trixie-backports 50 || true

log "installing ${missing[*]}"
apt-get update -qq
# --no-remove: the kernel build tools need trixie's libelf1t64, and letting apt
# resolve that by removing host packages (it would drop gdb or a bookworm
# qemu) must fail loudly instead of silently changing the host.
apt-get install -y -qq --no-install-recommends --no-remove "${missing[@]}" >/dev/null ||
	die "apt-get install ${missing[*]} failed (see apt's message above)"
for p in "${missing[@]}"; do installed "$p" || die "$p is still not installed"; done
log "done"
