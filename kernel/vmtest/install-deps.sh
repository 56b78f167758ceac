#!/usr/bin/env bash
# Installs the host tools the vma_cherrypick VM test needs (root): qemu,
# busybox-static, cpio and mmdebstrap, from the host's own suite.
#
# No kernel, header or compiler package goes into the host: those live in the
# trixie root that build-root.sh makes. Nothing here may remove a host
# package; if apt would, this fails and names them.
#
# Idempotent: nothing is fetched when everything is already installed.
set -euo pipefail

log() { printf 'kernel-deps: %s\n' "$*"; }
die() { printf 'kernel-deps: error: %s\n' "$*" >&2; exit 1; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for p in qemu-system-x86 busybox-static cpio mmdebstrap; do installed "$p" || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0

[ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}); run as root so they can be installed"
command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and this is not a Debian host"
export DEBIAN_FRONTEND=noninteractive

log "installing ${missing[*]}"
apt-get update -qq
plan=$(apt-get -s install -y --no-install-recommends "${missing[@]}") ||
	die "apt cannot install ${missing[*]} (its plan failed; see above)"
removals=$(printf '%s\n' "$plan" | awk '$1 == "Remv" {print $2}' | tr '\n' ' ')
[ -z "$removals" ] ||
	die "installing ${missing[*]} would remove host packages ($removals); install them by hand if that is acceptable"
apt-get install -y -qq --no-install-recommends --no-remove "${missing[@]}" >/dev/null ||
	die "apt-get install ${missing[*]} failed (see apt's message above)"
for p in "${missing[@]}"; do installed "$p" || die "$p is still not installed"; done
log "done"
