#!/usr/bin/env bash
# Installs the tclone binary and registers it with Podman as runtime "tclone".
#
#   hack/install.sh BIN [PREFIX]
#
# Idempotent: the binary is replaced only when it changed, and the
# containers.conf drop-in is written only when it differs.
set -euo pipefail
bin=${1:?usage: install.sh BIN [PREFIX]}
prefix=${2:-${PREFIX:-/usr/local}}
dest=$prefix/bin/tclone

log() { printf 'install: %s\n' "$*"; }

[ -x "$bin" ] || { echo "install: $bin is not an executable; run 'make build'" >&2; exit 1; }
install -d "$prefix/bin"
if ! cmp -s "$bin" "$dest"; then
	# Replace atomically: a running Podman may be executing the old binary.
	install -m 0755 "$bin" "$dest.new"
	mv -f "$dest.new" "$dest"
	log "installed $dest"
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
	default="runtime = \"tclone\"
"
fi
want="# Written by tclone's hack/install.sh.
[engine]
${default}
[engine.runtimes]
tclone = [\"$dest\"]
"
if [ "$(cat "$conf" 2>/dev/null)" != "$(printf '%s' "$want")" ]; then
	install -d "$(dirname "$conf")"
	printf '%s' "$want" >"$conf"
	log "registered runtime tclone in $conf"
fi
