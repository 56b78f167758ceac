#!/usr/bin/env bash
# Starts or stops the Podman API service on /run/podman/podman.sock, for REST
# clients, tclone's API service and the REST tests, where there is no
# systemd: the service runs as a plain background process whose PID is kept
# in /run/podman/tclone-service.pid.
#
#   hack/podman-service.sh start|stop|status
set -euo pipefail
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
. "$(dirname "$0")/lib/bgservice.sh"
# A fresh machine has no /run/podman; the service then fails with "bind: no
# such file or directory" (bg_service makes the directory).
bg_service "${1:-}" /run/podman/podman.sock /run/podman/tclone-service.pid /run/podman/service.log \
	/usr/bin/podman system service --time=0 unix:///run/podman/podman.sock
