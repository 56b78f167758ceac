#!/usr/bin/env bash
# Starts or stops tclone's API service (`tclone service`) on
# /run/tclone/tclone.sock where there is no systemd (with systemd, the
# tclone.socket unit the set-up installs starts it on the first request).
# It needs Podman's service, which start starts too (hack/podman-service.sh)
# and stop leaves running. The socket's group is tclone.
#
#   hack/tclone-service.sh start|stop|status
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/bgservice.sh"
tclone=${TCLONE:-/usr/local/bin/tclone}
if [ "${1:-}" = start ]; then
	"$here/podman-service.sh" start
fi
# Forks under way finish before it exits (up to 2 minutes).
BG_STOP_WAIT=1300 bg_service "${1:-}" /run/tclone/tclone.sock /run/tclone/service.pid /run/tclone/service.log \
	"$tclone" service --url unix:///run/tclone/tclone.sock --group tclone
