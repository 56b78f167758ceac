#!/usr/bin/env bash
# Starts or stops a local OCI registry on loopback (Debian's
# docker-registry, hack/kube/registry.yml), where there is no systemd, and
# on start pushes the local images tclone's Kubernetes tests run into it
# (each once). containerd pulls them from it as localhost:5000/NAME.
#
#   hack/registry.sh start|stop|status
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/bgservice.sh"
. "$here/lib/kube.sh"
export PODMAN_IGNORE_CGROUPSV1_WARNING=1

case "${1:-}" in
start)
	command -v docker-registry >/dev/null || { echo "registry.sh: docker-registry is not installed (hack/setup-host.sh installs it)" >&2; exit 1; }
	mkdir -p "$REGISTRY_STATE" "$REGISTRY_ROOT"
	sed -e "s|@ADDR@|$REGISTRY|g" -e "s|@ROOT@|$REGISTRY_ROOT|g" "$here/kube/registry.yml" >"$REGISTRY_STATE/config.yml"
	BG_READY="curl -sf http://$REGISTRY/v2/" bg_service start "$REGISTRY_STATE/none" "$REGISTRY_STATE/registry.pid" "$REGISTRY_STATE/registry.log" \
		/usr/bin/docker-registry serve "$REGISTRY_STATE/config.yml"
	registry_push_images
	;;
stop | status)
	bg_service "$1" "$REGISTRY_STATE/none" "$REGISTRY_STATE/registry.pid" "$REGISTRY_STATE/registry.log" true
	;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
