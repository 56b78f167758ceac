#!/bin/sh
# Installed as /usr/local/bin/podman by tclone's hack/install.sh, ahead of
# /usr/bin/podman in PATH. `podman container fork ...` runs podman-fork;
# everything else is Podman's own, unchanged.
if [ "$1" = container ] && [ "$2" = fork ]; then
	shift 2
	exec /usr/local/bin/podman-fork "$@"
fi
exec /usr/bin/podman "$@"
