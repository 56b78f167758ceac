#!/usr/bin/env bash
# Builds the local test images. No registry is reachable from these machines,
# so the images are made from Debian packages and imported into Podman.
#
#   localhost/tclone-busybox:latest    busybox-static only (a few MB)
#   localhost/tclone-pause:latest      catatonit -P: a pod's sandbox
#   localhost/tclone-shell:latest      a shell and nothing else: busybox as
#                                      /bin/sh without its applet links, so no
#                                      `true`, `ls`, ... exist as programs
#   localhost/tclone-workspace:latest  Debian trixie with bash, tmux, python3,
#                                      coreutils, procps, git, iproute2, curl
#   localhost/tclone-pyclient:latest   Debian trixie with python3-podman
#   localhost/tclone-postgres:latest   Debian trixie with PostgreSQL, a cluster
#                                      initialised, run as postgres
#
# An image that already exists is left alone; set TCLONE_REBUILD_IMAGES=1 to
# rebuild them all.
set -euo pipefail
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
. "$(cd "$(dirname "$0")" && pwd)/lib/mmdebstrap.sh"

log() { printf 'build-images: %s\n' "$*"; }
die() { printf 'build-images: error: %s\n' "$*" >&2; exit 1; }

rebuild=${TCLONE_REBUILD_IMAGES:-0}
work=$(mktemp -d /var/tmp/tclone-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

need_image() {
	[ "$rebuild" = 1 ] || ! podman image exists "$1"
}

# users_and_groups ROOT: the few files programs expect to find (passwd and
# group for user lookup).
users_and_groups() {
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$1/etc/group"
}

# busybox: a static busybox with its applet links, plus /etc/passwd, group, /tmp.
if need_image localhost/tclone-busybox:latest; then
	[ -x /bin/busybox ] || die "/bin/busybox is missing; install busybox-static"
	log "building localhost/tclone-busybox"
	root=$work/busybox
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root,var/tmp}
	chmod 1777 "$root/tmp" "$root/var/tmp"
	cp /bin/busybox "$root/bin/busybox"
	for applet in $(/bin/busybox --list-full); do
		[ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
	done
	users_and_groups "$root"
	tar -C "$root" -c . | podman import --quiet - localhost/tclone-busybox:latest >/dev/null
fi

# pause: a Kubernetes pod's sandbox image (containerd's pinned sandbox in
# hack/kube/containerd.toml): catatonit, static, as Podman's own pause.
if need_image localhost/tclone-pause:latest; then
	[ -x /usr/bin/catatonit ] || die "/usr/bin/catatonit is missing; install catatonit"
	log "building localhost/tclone-pause"
	root=$work/pause
	mkdir -p "$root"/{etc,proc,sys,dev}
	cp /usr/bin/catatonit "$root/catatonit"
	users_and_groups "$root"
	tar -C "$root" -c . | podman import --quiet --change 'ENTRYPOINT ["/catatonit", "-P"]' - localhost/tclone-pause:latest >/dev/null
fi

# shell: what a minimal image (busybox-minimal, distroless with one binary)
# looks like to a runtime: the static busybox as /bin/sh, which runs as the
# shell whatever it is called, and no other program. Commands work only as
# shell builtins inside `sh -c`; exec'ing `true` fails with "not found".
if need_image localhost/tclone-shell:latest; then
	[ -x /bin/busybox ] || die "/bin/busybox is missing; install busybox-static"
	log "building localhost/tclone-shell"
	root=$work/shell
	mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev}
	chmod 1777 "$root/tmp"
	cp /bin/busybox "$root/bin/sh"
	users_and_groups "$root"
	tar -C "$root" -c . | podman import --quiet --change 'CMD ["/bin/sh"]' - localhost/tclone-shell:latest >/dev/null
fi

# workspace: what an agent's dev container holds. mmdebstrap takes about a
# minute from the Debian mirror.
if need_image localhost/tclone-workspace:latest; then
	command -v mmdebstrap >/dev/null || die "mmdebstrap is missing; install it"
	log "building localhost/tclone-workspace (mmdebstrap trixie, about a minute)"
	tclone_mmdebstrap --quiet --variant=apt \
		--include=bash,tmux,python3,procps,coreutils,git,iproute2,curl,ca-certificates \
		--customize-hook='echo workspace >"$1/etc/hostname"' \
		trixie "$work/workspace.tar" http://deb.debian.org/debian
	podman import --quiet --change 'CMD ["/bin/bash"]' "$work/workspace.tar" localhost/tclone-workspace:base >/dev/null
	# A workspace image carries a machine-id, as images built from a
	# booted system do; a fork must give each sibling its own. mmdebstrap
	# empties the file on purpose, so it is written in a layer of its own.
	podman rm -f tclone-image-build >/dev/null 2>&1 || true
	podman run --name tclone-image-build --runtime crun localhost/tclone-workspace:base \
		sh -c 'od -An -N16 -tx1 /dev/urandom | tr -d " \n" >/etc/machine-id && echo >>/etc/machine-id' >/dev/null
	podman commit --quiet --change 'CMD ["/bin/bash"]' tclone-image-build localhost/tclone-workspace:latest >/dev/null
	podman rm -f tclone-image-build >/dev/null
	podman rmi localhost/tclone-workspace:base >/dev/null
fi
# pyclient: a REST client in Python, Debian's python3-podman (podman-py), for
# the REST tests. It runs as a container, so the host's Python never moves
# to the newer suite python3-podman needs on bookworm.
if need_image localhost/tclone-pyclient:latest; then
	command -v mmdebstrap >/dev/null || die "mmdebstrap is missing; install it"
	log "building localhost/tclone-pyclient (mmdebstrap trixie with python3-podman, about a minute)"
	tclone_mmdebstrap --quiet --variant=apt --include=python3-podman \
		trixie "$work/pyclient.tar" http://deb.debian.org/debian
	podman import --quiet --change 'CMD ["/usr/bin/python3"]' "$work/pyclient.tar" localhost/tclone-pyclient:latest >/dev/null
fi
# postgres: Debian's PostgreSQL with a database cluster initialised at
# /var/lib/postgresql/data, for make ci-example and its test. The server
# runs as postgres, on its unix socket in /tmp (the image's /run is empty)
# and on localhost.
if need_image localhost/tclone-postgres:latest; then
	command -v mmdebstrap >/dev/null || die "mmdebstrap is missing; install it"
	log "building localhost/tclone-postgres (mmdebstrap trixie with postgresql, about a minute)"
	tclone_mmdebstrap --quiet --variant=apt --include=postgresql,postgresql-contrib \
		--customize-hook='chroot "$1" sh -c "pg_dropcluster --stop 17 main 2>/dev/null || true"' \
		--customize-hook='chroot "$1" install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data' \
		--customize-hook='chroot "$1" su postgres -s /bin/sh -c "/usr/lib/postgresql/17/bin/initdb --no-sync -A trust -D /var/lib/postgresql/data >/dev/null"' \
		trixie "$work/postgres.tar" http://deb.debian.org/debian
	podman import --quiet --change 'USER postgres' --change 'ENV PATH=/usr/lib/postgresql/17/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["postgres", "-D", "/var/lib/postgresql/data", "-c", "listen_addresses=localhost", "-c", "unix_socket_directories=/tmp"]' \
		--change 'ENV PGHOST=/tmp' \
		"$work/postgres.tar" localhost/tclone-postgres:latest >/dev/null
fi
log "images ready"
