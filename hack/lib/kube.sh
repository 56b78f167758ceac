# Used by hack/containerd.sh and hack/registry.sh (sourced): where tclone's
# own containerd and the local registry keep their files, and the local
# images the Kubernetes tests run.

KUBE_STATE=/run/tclone-containerd
KUBE_ROOT=/var/lib/tclone-containerd
KUBE_CNI=/etc/tclone/containerd/cni
KUBE_CERTS=/etc/tclone/containerd/certs.d
KUBE_CONFIG=/etc/tclone/containerd/config.toml
KUBE_SOCK=$KUBE_STATE/containerd.sock
KUBE_PIDFILE=$KUBE_STATE/containerd.pid
KUBE_LOG=$KUBE_STATE/containerd.log
# The local registry, on loopback.
REGISTRY=127.0.0.1:5000
REGISTRY_NAME=localhost:5000
REGISTRY_STATE=/run/tclone-registry
REGISTRY_ROOT=/var/lib/tclone-registry
# The images the Kubernetes tests run, built by hack/build-images.sh and
# pushed to the registry as $REGISTRY_NAME/<name without localhost/>.
KUBE_IMAGES="localhost/tclone-pause:latest localhost/tclone-busybox:latest localhost/tclone-workspace:latest"

kube_ctr() { ctr --address "$KUBE_SOCK" --namespace k8s.io "$@"; }

# kube_write_config BINDIR: containerd's configuration and its CNI network,
# from the templates in hack/kube.
kube_write_config() {
	local bindir=$1 kube_dir
	kube_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../kube" && pwd)
	mkdir -p "$(dirname "$KUBE_CONFIG")" "$KUBE_CNI" "$KUBE_STATE" "$KUBE_ROOT"
	sed -e "s|@ROOT@|$KUBE_ROOT|g" -e "s|@STATE@|$KUBE_STATE|g" -e "s|@CNI@|$KUBE_CNI|g" -e "s|@BINDIR@|$bindir|g" \
		-e "s|@CERTS@|$KUBE_CERTS|g" -e "s|@REGISTRY@|$REGISTRY_NAME|g" \
		"$kube_dir/containerd.toml" >"$KUBE_CONFIG.new"
	mv "$KUBE_CONFIG.new" "$KUBE_CONFIG"
	cp "$kube_dir/cni.conflist" "$KUBE_CNI/10-tclone-cri.conflist"
	# The local registry speaks plain HTTP on loopback.
	mkdir -p "$KUBE_CERTS/$REGISTRY_NAME"
	printf 'server = "http://%s"\n\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' \
		"$REGISTRY" "$REGISTRY" >"$KUBE_CERTS/$REGISTRY_NAME/hosts.toml"
}

# registry_push_images: Podman's local test images into the registry, each
# once (the registry's manifest names Podman's image ID as its config).
registry_push_images() {
	local img id name
	for img in $KUBE_IMAGES; do
		id=$(podman image inspect --format '{{.Id}}' "$img" 2>/dev/null) || {
			echo "registry.sh: image $img is missing (hack/build-images.sh builds it)" >&2
			return 1
		}
		name=$REGISTRY_NAME/${img#localhost/}
		if curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' 			"http://$REGISTRY/v2/${name#*/}" -o /dev/null 2>/dev/null; then :; fi
		if curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' 			"http://$REGISTRY/v2/$(registry_repo "$img")/manifests/latest" 2>/dev/null | grep -q "sha256:$id"; then
			continue
		fi
		podman push --quiet --tls-verify=false --format oci "$img" "$name" >/dev/null
	done
}

# registry_repo IMAGE: its repository in the registry.
registry_repo() { local r=${1#localhost/}; echo "${r%:*}"; }
