#!/usr/bin/env bash
# hack/build-criu.sh installs the twin plugin it builds from these sources
# whenever the installed one's stamp names others, even when the plugin
# left in the shared build tree (another checkout's) is newer than these
# sources, as make's times would keep it. Run after the set-up (it copies
# the installed build into a directory of its own, and rebuilds the
# plugin in the shared build tree); run as root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
real=${TCLONE_CRIU_DIR:-/usr/local/lib/tclone/criu}
cache=${TCLONE_CRIU_BUILD:-/var/cache/tclone/criu-build}

fail() { printf 'build-criu-test: FAIL: %s\n' "$*" >&2; exit 1; }

[ -x "$real/criu" ] && [ -f "$real/.stamp" ] || fail "no tclone build of CRIU in $real: run the set-up first (hack/setup-host.sh)"
version=$(criu --version | awk '/^Version:/ {print $2}')
build=$cache/criu-$version
[ -d "$build" ] || fail "no CRIU build tree in $build: run the set-up first (hack/setup-host.sh)"

tmp=$(mktemp -d -t tclone-build-criu-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp -a "$real" "$tmp/criu"
# Another checkout's plugin: its stamp, and its build left in the tree,
# dated after these sources.
sed -i '2s/.*/0000000000000000/' "$tmp/criu/.stamp"
printf 'a plugin of another checkout\n' >"$build/tclone_twin.so"
touch -d '+1 hour' "$build/tclone_twin.so"

TCLONE_CRIU_DIR=$tmp/criu "$here/build-criu.sh" >/dev/null
magic=$(head -c 4 "$tmp/criu/plugins/tclone_twin.so" | od -An -c | tr -d ' ')
[ "$magic" = '177ELF' ] || fail "the plugin installed is the build tree's stale one, not one built from these sources"
want=$(cd "$here/../criuhooks/criu" && cat twin.c twin.h tramp.S Makefile | sha256sum | cut -c1-16)
[ "$(sed -n 2p "$tmp/criu/.stamp")" = "$want" ] || fail "the stamp does not name these sources"
printf 'build-criu-test: ok (a newer plugin of another checkout in the build tree is rebuilt from these sources)\n'
