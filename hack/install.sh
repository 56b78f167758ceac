#!/usr/bin/env bash
# Installs tclone and podman-fork and registers tclone with Podman.
#
#   hack/install.sh BINDIR [PREFIX]
#
# BINDIR holds the built tclone, tclone-service and podman-fork. Idempotent: binaries are
# replaced only when they changed, and configuration is written only when it
# differs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${1:?usage: install.sh BINDIR [PREFIX]}
prefix=${2:-${PREFIX:-/usr/local}}

log() { printf 'install: %s\n' "$*"; }

put() { # src dest
	local src=$1 dest=$2
	[ -x "$src" ] || { echo "install: $src is missing; run 'make build'" >&2; exit 1; }
	if ! cmp -s "$src" "$dest"; then
		# Replace atomically: Podman may be executing the old binary.
		install -m 0755 "$src" "$dest.new"
		mv -f "$dest.new" "$dest"
		log "installed $dest"
	fi
}

install -d "$prefix/bin"
put "$bindir/tclone" "$prefix/bin/tclone"
# `tclone service` runs it from beside tclone.
put "$bindir/tclone-service" "$prefix/bin/tclone-service"
put "$bindir/podman-fork" "$prefix/bin/podman-fork"
# `podman container branch` is podman-fork called by this name.
if [ "$(readlink "$prefix/bin/podman-branch" 2>/dev/null)" != podman-fork ]; then
	ln -sfn podman-fork "$prefix/bin/podman-branch"
	log "installed $prefix/bin/podman-branch"
fi
# `podman container fork` goes to podman-fork through this wrapper; it
# shadows /usr/bin/podman only by coming first in PATH, so it is never
# installed over Podman itself.
if [ -x /usr/bin/podman ] && [ "$(realpath -m "$prefix/bin/podman")" != "$(realpath /usr/bin/podman)" ]; then
	wrapper=$(mktemp)
	sed "s#@PODMAN_FORK@#$prefix/bin/podman-fork#" "$here/podman-wrapper.sh" >"$wrapper"
	chmod 0755 "$wrapper"
	put "$wrapper" "$prefix/bin/podman"
	rm -f "$wrapper"
elif [ -x /usr/bin/podman ]; then
	log "not installing the podman wrapper over Podman itself; run $prefix/bin/podman-fork for podman container fork"
fi

# Podman reads drop-ins from containers.conf.d; a drop-in leaves the
# administrator's own containers.conf untouched.
#
# tclone also becomes Podman's default runtime (TCLONE_DEFAULT_RUNTIME=0 to
# skip): it runs every container exactly as crun would, and a Podman service
# restores imported checkpoints (which is how a fork makes siblings) with its
# default runtime, so REST clients can fork only when tclone is the default.
conf=/etc/containers/containers.conf.d/50-tclone.conf
default=""
if [ "${TCLONE_DEFAULT_RUNTIME:-1}" = 1 ]; then
	default='runtime = "tclone"'
fi
want="# Written by tclone's hack/install.sh.
[engine]
$default

[engine.runtimes]
tclone = [\"$prefix/bin/tclone\"]"
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
	install -d "$(dirname "$conf")"
	printf '%s\n' "$want" >"$conf"
	log "registered runtime tclone in $conf"
fi

# tclone's API service (`tclone service`): users of the group tclone may use
# its socket, locally or over ssh.
if ! getent group tclone >/dev/null; then
	groupadd --system tclone
	log "created the group tclone (members may fork through /run/tclone/tclone.sock)"
fi
unitdir=$prefix/lib/systemd/system
install -d "$unitdir"
changed=0
for unit in tclone.socket tclone.service; do
	want=$(sed "s#@PREFIX@#$prefix#" "$here/systemd/$unit")
	if [ "$(cat "$unitdir/$unit" 2>/dev/null)" != "$want" ]; then
		printf '%s\n' "$want" >"$unitdir/$unit"
		log "installed $unitdir/$unit"
		changed=1
	fi
done
# Where systemd runs, the socket is enabled and started (the service starts
# on the first request); elsewhere hack/tclone-service.sh starts it.
if [ -d /run/systemd/system ]; then
	if [ $changed = 1 ]; then systemctl daemon-reload; fi
	systemctl enable --now tclone.socket >/dev/null 2>&1 && log "tclone.socket enabled" ||
		log "enabling tclone.socket failed; see systemctl status tclone.socket"
fi
