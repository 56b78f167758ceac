#!/usr/bin/env bash
# Builds tclone's CRIU (the host's CRIU version with criuhooks/criu's
# patches: the options lazy-pages-external, tmpfs-builtin-tar,
# skip-conntrack, smaps-read-ahead and busy-wait, four speed-ups of
# dumps, a plugin hook and a notification once a dump's tree runs again,
# and injected calls and parasite commands a killed CRIU leaves the task
# alive after) and
# tclone's twin plugin, from Debian's source of the CRIU the
# host runs, and installs both under $TCLONE_CRIU_DIR
# (default /usr/local/lib/tclone/criu): criu, and plugins/tclone_twin.so.
# The host's own /usr/sbin/criu is not touched; only tclone's dumps use this
# build (see runtime/fork/criubuild.go and docs/design.md).
#
# Idempotent: a build whose stamp matches the source, the patches and the
# plugin is kept. Called by hack/setup-host.sh; run as root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
src_dir=$top/criuhooks/criu
dest=${TCLONE_CRIU_DIR:-/usr/local/lib/tclone/criu}
cache=${TCLONE_CRIU_BUILD:-/var/cache/tclone/criu-build}

log() { printf 'build-criu: %s\n' "$*"; }
die() { printf 'build-criu: error: %s\n' "$*" >&2; exit 1; }

command -v criu >/dev/null || die "criu is not installed (hack/setup-host.sh installs it first)"
version=$(criu --version | awk '/^Version:/ {print $2}')
[ -n "$version" ] || die "cannot tell the installed criu's version"

# The upstream source of each CRIU version tclone builds, from Debian's
# archive (the orig tarball of the package the host runs), and its SHA-256
# from that package's .dsc.
case "$version" in
4.2.1)
	url=http://deb.debian.org/debian/pool/main/c/criu/criu_4.2.1.orig.tar.xz
	sum=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
	;;
*)
	die "no known source for CRIU $version: add it to hack/build-criu.sh (the orig tarball of Debian's criu package and its sha256 from the .dsc)"
	;;
esac

# Two stamps: CRIU is rebuilt when its source or the patch changes, the
# plugin when its own source does (against the CRIU tree kept in $cache).
# The patches, in the order they apply, and the files tmpfs-builtin-tar adds.
patches=(lazy-pages-external.patch tmpfs-builtin-tar.patch lazy-dump-iovs.patch skip-conntrack.patch scan-anon-pages.patch smaps-read-ahead.patch busy-wait.patch file-ids-dirs.patch dump-resumed.patch compel-fini-calls.patch compel-safe-calls.patch)
added=(tmpfs-archive.c:criu/tmpfs-archive.c tmpfs-archive.h:criu/include/tmpfs-archive.h)
# The options they add; the stamp's third line lists them for tclone.
options="lazy-pages-external tmpfs-builtin-tar skip-conntrack smaps-read-ahead busy-wait"
# CRIU caches what it finds out about the kernel (kerndat, 20-30 ms of
# probing before each dump) in RUNDIR/criu.kdat, only on a tmpfs, and marks
# it with its build: the host's criu (restores) finds this build's cache
# stale and the other way round. This build keeps its own in the plans'
# tmpfs, in a directory tclone makes before each dump (the stamp's first
# line names it).
rundir=/run/tclone/plans/.criu
criu_stamp="$version $sum $(cd "$src_dir" && cat "${patches[@]}" "${added[@]%%:*}" | sha256sum | cut -c1-16) RUNDIR=$rundir"
plugin_stamp="$(cat "$src_dir/twin.c" "$src_dir/twin.h" "$src_dir/tramp.S" "$src_dir/Makefile" | sha256sum | cut -c1-16)"
build=$cache/criu-$version
criu_ok=0
if [ -x "$dest/criu" ] && [ "$(sed -n 1p "$dest/.stamp" 2>/dev/null)" = "$criu_stamp" ] && [ -f "$build/criu/include/version.h" ]; then
	criu_ok=1
fi
if [ $criu_ok = 1 ] && [ -f "$dest/plugins/tclone_twin.so" ] && [ "$(sed -n 2p "$dest/.stamp" 2>/dev/null)" = "$plugin_stamp" ]; then
	log "tclone's CRIU $version and its plugin are up to date in $dest"
	exit 0
fi

# Build dependencies: each -dev package at exactly the version of the
# library the host's criu runs with (they come from several suites on a
# bookworm host), and protoc from the suite criu came from.
installed() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
criu_suite=$(apt-cache policy criu | awk '/\*\*\*/ {getline; print $3; exit}')
criu_suite=${criu_suite%%/*}
need=()
# available PKG: every version of PKG the archive has.
available() { apt-cache madison "$1" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}'; }
add_dev() { # add_dev DEVPKG RUNTIME-PKG...
	local dev=$1 v lib p newer
	shift
	for p in "$@"; do
		if [ -n "$(installed "$p")" ]; then
			lib=$p
			break
		fi
	done
	[ -n "${lib:-}" ] || die "none of $* is installed, so $dev cannot be matched to it"
	v=$(installed "$lib")
	[ "$(installed "$dev")" = "$v" ] && return
	if available "$dev" | grep -qxF "$v"; then
		need+=("$dev=$v")
		return
	fi
	# The archive moved on from the installed library (a point release
	# or a rebuild replaced it): the newest build of the same upstream
	# release, the library raised to it along with its -dev package.
	newer=$(available "$dev" | grep -F "${v%%+*}" | while read -r p; do
		[ "${p#"${v%%+*}"}" != "$p" ] && dpkg --compare-versions "$p" gt "$v" && echo "$p"
	done | sort -V | tail -1)
	[ -n "$newer" ] ||
		die "the archive has no $dev for $lib $v (nor a later build of ${v%%+*}): update the host's packages (apt-get update && apt-get upgrade $lib) and run the set-up again"
	log "$lib $v is no longer in the archive: raising it to $newer, with $dev"
	need+=("$dev=$newer" "$lib=$newer")
}
add_dev libprotobuf-c-dev libprotobuf-c1
add_dev protobuf-c-compiler libprotobuf-c1
add_dev libnl-3-dev libnl-3-200
add_dev libnet1-dev libnet9 libnet1t64 libnet1
add_dev libcap-dev libcap2
add_dev libbsd-dev libbsd0
add_dev libnftables-dev libnftables1
add_dev libgnutls28-dev libgnutls30t64 libgnutls30
add_dev uuid-dev libuuid1
for p in protobuf-compiler libprotobuf-dev; do
	if [ -z "$(installed "$p")" ]; then
		if [ -n "$criu_suite" ] && [ "$criu_suite" != "now" ]; then
			need+=("$p/$criu_suite")
		else
			need+=("$p")
		fi
	fi
done
for p in make gcc pkgconf xz-utils; do
	[ -n "$(installed "$p")" ] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing CRIU's build dependencies: ${need[*]}"
	plan=$(apt-get -s install -y --no-install-recommends "${need[@]}") || die "apt cannot install ${need[*]}"
	removals=$(printf '%s\n' "$plan" | awk '$1 == "Remv" {printf "%s ", $2}')
	[ -z "$removals" ] || log "installing them removes these host packages: $removals"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}" >/dev/null ||
		die "apt-get install ${need[*]} failed"
fi

mkdir -p "$cache"
if [ $criu_ok = 1 ]; then
	# Rebuilt whatever make's times say: the plugin in the build tree may
	# be newer than these sources and built from others (another
	# checkout's), and the stamp written below names these
	# (hack/build-criu-test.sh).
	rm -f "$build/tclone_twin.so"
	make -C "$src_dir" CRIU_SRC="$build" OUT="$build/tclone_twin.so" >"$cache/plugin.log" 2>&1 || {
		tail -20 "$cache/plugin.log" >&2
		die "building the twin plugin failed (log: $cache/plugin.log)"
	}
	install -d -m 0755 "$dest/plugins"
	install -m 0644 "$build/tclone_twin.so" "$dest/plugins/tclone_twin.so.new"
	mv "$dest/plugins/tclone_twin.so.new" "$dest/plugins/tclone_twin.so"
	printf '%s\n%s\noptions %s\n' "$criu_stamp" "$plugin_stamp" "$options" >"$dest/.stamp"
	log "rebuilt tclone's twin plugin in $dest"
	exit 0
fi
tarball=$cache/$(basename "$url")
if [ ! -f "$tarball" ] || [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$sum" ]; then
	log "downloading $url"
	curl -fsSL --retry 3 -o "$tarball.part" "$url" || die "cannot download $url"
	got=$(sha256sum "$tarball.part" | cut -d' ' -f1)
	[ "$got" = "$sum" ] || die "$url has sha256 $got, want $sum"
	mv "$tarball.part" "$tarball"
fi
rm -rf "$build"
mkdir -p "$build"
tar -C "$build" --strip-components=1 -xf "$tarball"
for p in "${patches[@]}"; do
	patch -d "$build" -p1 -s <"$src_dir/$p" || die "$p does not apply to CRIU $version"
done
for a in "${added[@]}"; do
	cp "$src_dir/${a%%:*}" "$build/${a#*:}"
done
log "building CRIU $version with $options (about a minute)"
make -C "$build" -j"$(nproc)" RUNDIR="$rundir" criu >"$cache/build.log" 2>&1 || {
	tail -20 "$cache/build.log" >&2
	die "building CRIU failed (log: $cache/build.log)"
}
make -C "$src_dir" CRIU_SRC="$build" OUT="$build/tclone_twin.so" >>"$cache/build.log" 2>&1 || {
	tail -20 "$cache/build.log" >&2
	die "building the twin plugin failed (log: $cache/build.log)"
}
# Read whole first: grep -q stops at its match, and criu, writing the rest
# of its help to a closed pipe, would die of SIGPIPE and fail the pipeline
# (pipefail) now and then. Its help holds a NUL byte, which bash would warn of.
help=$("$build/criu/criu" --help 2>&1 | tr -d '\000') || true
for o in $options; do
	grep -q -- "--$o" <<<"$help" || die "the built criu has no --$o"
done

install -d -m 0755 "$dest" "$dest/plugins"
install -m 0755 "$build/criu/criu" "$dest/criu.new"
mv "$dest/criu.new" "$dest/criu"
install -m 0644 "$build/tclone_twin.so" "$dest/plugins/tclone_twin.so.new"
mv "$dest/plugins/tclone_twin.so.new" "$dest/plugins/tclone_twin.so"
printf '%s\n%s\noptions %s\n' "$criu_stamp" "$plugin_stamp" "$options" >"$dest/.stamp"
log "installed tclone's CRIU $version and its twin plugin in $dest"
