#!/usr/bin/env bash
# Proves that the set-up works on a fresh machine without taking host
# packages away, by doing it for real in a throw-away root (root, about ten
# minutes, a few GB under /var/tmp; not part of `make test`):
#
#  1. mmdebstrap a Debian bookworm root with the fresh machine's apt sources
#     and install every package of the fresh machine's list into it (those
#     Debian has; third-party ones such as google-cloud-cli are skipped);
#  2. run hack/setup-host.sh's package step in it (TCLONE_SETUP_PACKAGES_ONLY),
#     then kernel/vmtest/install-deps.sh, exactly as on a host;
#  3. compare the package lists: fail if anything was removed other than the
#     documented removals below or a library's move to its 64-bit-time name
#     (libfoo1 -> libfoo1t64), if a package that must stay is gone, or if
#     mmdebstrap (which kernel-test and the images use) prints dash's printf
#     usage error through hack/lib/mmdebstrap.sh.
#
#   hack/check-fresh-setup.sh [PACKAGE_LIST]
#
# PACKAGE_LIST: "name version" lines (default hack/testdata/fresh-bookworm-packages.txt).
# Environment:
#   TCLONE_FRESH_ROOT  where the root is made (default /var/tmp/tclone-fresh-root)
#   TCLONE_FRESH_KEEP  1 keeps the root afterwards
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
list=${1:-$here/testdata/fresh-bookworm-packages.txt}
dir=${TCLONE_FRESH_ROOT:-/var/tmp/tclone-fresh-root}
mirror=http://deb.debian.org/debian

# What the set-up takes away on bookworm, and why it may:
# - Podman's stack from trixie replaces bookworm's glib: PackageKit and
#   software-properties-common (desktop update helpers built on it) and
#   libglib2.0-bin (no successor of the same name) go.
# - criu from forky brings forky's gnutls; bookworm's libgnutls28-dev must
#   follow it, and forky's gnutls no longer ships the C++ binding
#   (libgnutlsxx30) or the OpenSSL compatibility library
#   (libgnutls-openssl27); nothing but that -dev package used them.
documented_removals="packagekit packagekit-tools software-properties-common libglib2.0-bin
	libgnutlsxx30 libgnutls-openssl27"
# What must survive (the tools a developer uses, and what kernel-test needs).
must_stay="gdb linux-perf libelf1 git curl python3 qemu-system-x86 busybox-static cpio mmdebstrap"

log() { printf 'check-fresh-setup: %s\n' "$*"; }
die() { printf 'check-fresh-setup: error: %s\n' "$*" >&2; exit 1; }

. "$here/lib/mmdebstrap.sh"

[ "$(id -u)" = 0 ] || die "run as root (it makes a root with mmdebstrap and chroots into it)"
[ -r "$list" ] || die "cannot read the package list $list"
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing; apt-get install mmdebstrap"

no_mounts_below() {
	! awk -v d="$(realpath "$1")/" '{ if (index($5 "/", d) == 1) found = 1 } END { exit !found }' /proc/self/mountinfo
}

cleanup() {
	if [ "${TCLONE_FRESH_KEEP:-0}" = 1 ]; then
		log "kept $dir"
	elif [ -d "$dir" ] && no_mounts_below "$dir"; then
		rm -rf "$dir"
	fi
}
trap cleanup EXIT

# in_root CMD...: runs CMD in the root with its own /proc, a read-only /sys
# and a private /dev/pts (all gone when CMD ends), the device nodes
# mmdebstrap made, and no daemon allowed to start (policy-rc.d). Nothing of
# the host's /dev or /sys is writable from there.
in_root() {
	unshare --mount --pid --fork --mount-proc="$dir/proc" sh -c '
		root=$1; shift
		mount -t sysfs -o ro sysfs "$root/sys" &&
			mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" &&
			mount --bind "$root/dev/pts/ptmx" "$root/dev/ptmx" &&
			exec chroot "$root" "$@"' sh "$dir" \
		env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
		LC_ALL=C DEBIAN_FRONTEND=noninteractive "$@"
}

packages_of() {
	in_root dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort -u >"$1"
}

start=$SECONDS
no_mounts_below "$dir" 2>/dev/null || die "$dir has mounts below it; unmount them first"
rm -rf "$dir"

# --- 1. A fresh machine ------------------------------------------------------
log "making a bookworm root in $dir"
tclone_mmdebstrap --quiet --variant=apt \
	--customize-hook='rm -f "$1/etc/apt/sources.list"' \
	bookworm "$dir" "deb $mirror bookworm main" >/dev/null ||
	die "mmdebstrap could not make the bookworm root"
# The fresh machine's sources, in its own file and format (setup-host.sh
# reads the host's suite from it).
cat >"$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# The machine's own apt settings (files no package owns), e.g. those that
# let apt accept a mirror whose Release dates lag this machine's clock.
for f in /etc/apt/apt.conf.d/*; do
	[ -f "$f" ] && ! dpkg -S "$f" >/dev/null 2>&1 && cp "$f" "$dir/etc/apt/apt.conf.d/"
done
printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
chmod 755 "$dir/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
in_root apt-get update -qq

in_root apt-cache --generate pkgnames | sort -u >"$dir/tmp/available"
awk '!/^#/ && NF {print $1}' "$list" | sort -u >"$dir/tmp/wanted"
sed 's/:amd64$//' "$dir/tmp/wanted" | sort -u | comm -23 - "$dir/tmp/available" >"$dir/tmp/skipped"
mapfile -t wanted < <(awk -F: 'NR == FNR { skip[$1] = 1; next } !($1 in skip)' "$dir/tmp/skipped" "$dir/tmp/wanted")
log "installing the fresh machine's ${#wanted[@]} Debian packages (skipped, not in Debian: $(wc -l <"$dir/tmp/skipped"))"
in_root apt-get install -y -qq --no-install-recommends "${wanted[@]}" >"$dir/tmp/fresh-install.log" 2>&1 ||
	{ tail -30 "$dir/tmp/fresh-install.log" >&2; die "the fresh package set does not install into the bookworm root"; }
packages_of "$dir/tmp/before"
apt_before=$(in_root dpkg-query -W -f='${Version}' apt)
log "fresh root ready: $(wc -l <"$dir/tmp/before") packages, apt $apt_before ($((SECONDS - start))s)"

# --- 2. The set-up's package steps -------------------------------------------
mkdir -p "$dir/tclone/kernel"
cp -a "$top/hack" "$dir/tclone/hack"
cp -a "$top/kernel/vmtest" "$dir/tclone/kernel/vmtest"
log "running hack/setup-host.sh (packages only) in the root"
in_root env TCLONE_SETUP_PACKAGES_ONLY=1 /tclone/hack/setup-host.sh 2>&1 | sed 's/^/  | /' ||
	die "hack/setup-host.sh failed in the fresh root (its output is above)"
log "running kernel/vmtest/install-deps.sh in the root"
in_root /tclone/kernel/vmtest/install-deps.sh 2>&1 | sed 's/^/  | /' ||
	die "kernel/vmtest/install-deps.sh failed in the fresh root (its output is above)"
packages_of "$dir/tmp/after"
apt_after=$(in_root dpkg-query -W -f='${Version}' apt)

# --- 3. What changed ---------------------------------------------------------
fail=0
mapfile -t removed < <(comm -23 "$dir/tmp/before" "$dir/tmp/after")
added=$(comm -13 "$dir/tmp/before" "$dir/tmp/after" | wc -l)
renamed=() undocumented=()
for p in "${removed[@]}"; do
	if grep -qx "${p}t64" "$dir/tmp/after"; then
		renamed+=("$p")
	elif printf '%s\n' $documented_removals | grep -qx "$p"; then
		:
	else
		undocumented+=("$p")
	fi
done
log "the set-up added $added packages and removed ${#removed[@]}: ${removed[*]:-none}"
log "  moved to their t64 names: ${renamed[*]:-none}"
if [ ${#undocumented[@]} -gt 0 ]; then
	log "FAIL: removed without being documented here: ${undocumented[*]}"
	fail=1
fi
for p in $must_stay; do
	grep -qx "$p" "$dir/tmp/after" || { log "FAIL: $p is not installed after the set-up"; fail=1; }
done
log "apt: $apt_before before, $apt_after after"

# mmdebstrap as kernel-test and build-images run it, in the set-up root:
# nothing but its own output, and no "printf: usage" from dash.
in_root sh -c '. /tclone/hack/lib/mmdebstrap.sh && tclone_mmdebstrap --quiet --variant=extract trixie /tmp/probe.tar' \
	>"$dir/tmp/probe.log" 2>&1 || { cat "$dir/tmp/probe.log" >&2; log "FAIL: mmdebstrap does not run in the set-up root"; fail=1; }
if grep -q 'printf: usage' "$dir/tmp/probe.log"; then
	log "FAIL: mmdebstrap printed dash's printf usage error in the set-up root"
	fail=1
fi

log "took $((SECONDS - start))s"
[ "$fail" = 0 ] || die "the set-up is not safe on a fresh machine (see FAIL lines above)"
log "PASS: the set-up installs on a fresh bookworm machine and removes only the documented packages"
