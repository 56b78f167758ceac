#!/usr/bin/env bash
# Starts or stops a containerd of tclone's own, with the CRI plugin and the
# runtime handler `tclone` (hack/kube/containerd.toml), for the Kubernetes
# tests and examples, where there is no systemd. It runs beside any
# containerd the host has, with its own root, state, socket and CNI network:
#
#   socket  /run/tclone-containerd/containerd.sock  (crictl -r unix://...)
#   root    /var/lib/tclone-containerd
#   CNI     /etc/tclone/containerd/cni (bridge tclone-cri0, 10.89.240.0/24)
#
# It pulls images, the pods' sandbox (pause) image among them, from the
# local registry (hack/registry.sh), over plain HTTP on loopback.
#
#   hack/containerd.sh start|stop|status
#
# Environment: TCLONE_BINDIR, where tclone is (default /usr/local/bin).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/bgservice.sh"
. "$here/lib/kube.sh"
export PODMAN_IGNORE_CGROUPSV1_WARNING=1

verb=${1:-}
case "$verb" in
start)
	command -v containerd >/dev/null || { echo "containerd.sh: containerd is not installed (hack/setup-host.sh installs it)" >&2; exit 1; }
	kube_write_config "${TCLONE_BINDIR:-/usr/local/bin}"
	BG_READY="kube_ctr version" bg_service start "$KUBE_SOCK" "$KUBE_PIDFILE" "$KUBE_LOG" \
		/usr/bin/containerd --config "$KUBE_CONFIG"
	;;
stop)
	# containerd leaves its shims (and their containers) running when it
	# stops, as it should; the tests remove their pods before this.
	bg_service stop "$KUBE_SOCK" "$KUBE_PIDFILE" "$KUBE_LOG" true
	;;
status)
	bg_service status "$KUBE_SOCK" "$KUBE_PIDFILE" "$KUBE_LOG" true
	;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
