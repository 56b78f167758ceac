# Used by hack/setup-host.sh (sourced,
# not run): adding Debian suites to apt, pinned so nothing on the host moves
# to them unless asked by name with -t or found nowhere else.

# tclone_have_suite SUITE: is the suite reachable through any apt source,
# ours or the host's own?
tclone_have_suite() {
	grep -rqsE "^(Suites:.*[[:space:]]$1([[:space:]]|\$)|deb .*[[:space:]]$1[[:space:]])" \
		/etc/apt/sources.list /etc/apt/sources.list.d/
}

# tclone_add_suite NAME SUITE PRIORITY: writes the source and its pin once.
# Returns 0 when it wrote something (apt-get update is then needed).
tclone_add_suite() {
	local name=$1 suite=$2 prio=$3 wrote=1
	local src=/etc/apt/sources.list.d/tclone-$name.sources
	local pin=/etc/apt/preferences.d/tclone-$name
	if [ ! -f "$src" ]; then
		cat >"$src" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
		wrote=0
	fi
	if [ ! -f "$pin" ]; then
		cat >"$pin" <<PIN
Package: *
Pin: release n=$suite
Pin-Priority: $prio
PIN
		wrote=0
	fi
	return $wrote
}

# tclone_host_suite: the Debian suite the host's own apt sources follow
# (bookworm, trixie, ...). /etc/os-release is no guide: installing Podman
# from trixie on bookworm upgrades base-files, and with it os-release.
tclone_host_suite() {
	local s
	s=$(awk '/^Suites:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
	if [ -z "$s" ]; then
		s=$(awk '$1 == "deb" && $0 !~ /security/ {print $3; exit}' /etc/apt/sources.list 2>/dev/null)
	fi
	if [ -z "$s" ]; then
		. /etc/os-release
		s=${VERSION_CODENAME:-}
	fi
	printf '%s\n' "${s%%-*}"
}
