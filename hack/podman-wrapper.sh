#!/bin/sh
# Installed as /usr/local/bin/podman by tclone's hack/install.sh, ahead of
# /usr/bin/podman in PATH. `podman [global options] container fork ...` runs
# podman-fork; everything else is Podman's own, unchanged.
#
# Global options before the verb are skipped to find it; the ones
# podman-fork also understands are passed on: --url, --connection,
# --identity (podman-fork's --ssh-identity: its --identity is the
# siblings'), --log-level=debug.
fork="@PODMAN_FORK@"
pass=""
skip=0
prev=""
i=1
for arg in "$@"; do
	if [ "$skip" = 1 ]; then
		skip=0
		case "$prev" in
		--url) pass="$pass --url=$arg" ;;
		--connection | -c) pass="$pass --connection=$arg" ;;
		--identity) pass="$pass --ssh-identity=$arg" ;;
		esac
	else
		case "$arg" in
		--url=* | --connection=*) pass="$pass $arg" ;;
		--identity=*) pass="$pass --ssh-identity=${arg#--identity=}" ;;
		--log-level=debug) pass="$pass --debug" ;;
		--url | --connection | -c | --identity | --log-level | --root | --runroot | --runtime | \
			--storage-driver | --tmpdir | --cgroup-manager | --events-backend | --network-backend | \
			--module | --config | --ssh)
			skip=1 ;;
		-*) ;;
		*) break ;;
		esac
	fi
	prev=$arg
	i=$((i + 1))
done
# $i is now the position of the first word that is not a global option.
eval "verb=\${$i:-} next=\${$((i + 1)):-}"
if [ "$verb" = container ] && [ "$next" = fork ]; then
	shift $((i + 1))
	# shellcheck disable=SC2086
	exec "$fork" $pass "$@"
fi
if [ "$verb" = container ] && [ "$next" = branch ]; then
	shift $((i + 1))
	# shellcheck disable=SC2086
	exec "${fork%/*}/podman-branch" $pass "$@"
fi
exec /usr/bin/podman "$@"
