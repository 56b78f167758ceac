#!/usr/bin/env bash
# Prepares a Debian host (root) to build, run and test tclone.
#
# Idempotent: every step first checks whether its work is already done, so a
# second run changes nothing and finishes in a few seconds.
#
#   hack/setup-host.sh              packages, cgroups, sysctls, images, tclone
#   hack/setup-host.sh --service    the same, then start the Podman API service
#
# Environment:
#   TCLONE_BINDIR  where the built tclone and podman-fork are (default: bin/ of this checkout)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
start_service=0
for arg in "$@"; do
	case "$arg" in
	--service) start_service=1 ;;
	*) echo "setup-host: unknown argument '$arg' (known: --service)" >&2; exit 2 ;;
	esac
done

. "$here/lib/apt-suites.sh"
log() { printf 'setup-host: %s\n' "$*"; }
die() { printf 'setup-host: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and configures cgroups)"
command -v apt-get >/dev/null || die "this script supports Debian hosts only (apt-get not found)"

export DEBIAN_FRONTEND=noninteractive
export PODMAN_IGNORE_CGROUPSV1_WARNING=1

# --- 1. Packages -------------------------------------------------------------
# Bookworm's criu (3.17) cannot parse this kernel's vDSO, and its podman is 4.x.
# Trixie has podman 5 / crun / conmon; CRIU >= 4.2 comes from testing (forky),
# because 4.1 cannot dump inet sockets on kernels >= 6.16 and hangs where
# hardware breakpoints do not fire. Both suites are pinned low so nothing else
# on the machine moves to them unless asked by name with -t.
have_criu_42() {
	command -v criu >/dev/null || return 1
	local v
	v=$(criu --version 2>/dev/null | awk '/^Version:/ {print $2}')
	[ -n "$v" ] || return 1
	dpkg --compare-versions "$v" ge 4.2
}

have_stack() {
	# ldconfig's list read whole: grep -q would leave it writing to a
	# closed pipe, and its SIGPIPE would fail the pipeline now and then.
	command -v nft >/dev/null && command -v iptables >/dev/null && grep -q 'libcriu\.so\.2 ' <<<"$(ldconfig -p)" &&
	command -v podman >/dev/null && command -v crun >/dev/null &&
		command -v conmon >/dev/null && have_criu_42 &&
		podman --version 2>/dev/null | grep -q 'version 5\.'
}

# Tools the tests and image builds use, all from the host's own suite.
host_tools=(mmdebstrap busybox-static tmux jq iproute2 socat curl btrfs-progs e2fsprogs xfsprogs
	python3 procps psmisc cpio qemu-system-x86 kmod)

missing_tools() {
	local p
	for p in "${host_tools[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
	done
}

# apt_install_showing_removals ARGS...: installs without recommends, first
# printing every package apt will remove to do it (a newer suite's library
# transitions can take host packages with them), so nothing goes silently.
apt_install_showing_removals() {
	local plan removals
	plan=$(apt-get -s install -y --no-install-recommends "$@") ||
		die "apt cannot install $* (its plan failed; see above)"
	# A library that only moves to its 64-bit-time name (libfoo1 ->
	# libfoo1t64) is replaced, not lost; everything else is said plainly.
	removals=$(printf '%s\n' "$plan" | awk '
		$1 == "Inst" { inst[$2] = 1 }
		$1 == "Remv" { remv[++n] = $2 }
		END { for (i = 1; i <= n; i++) if (!((remv[i] "t64") in inst)) printf "%s ", remv[i] }')
	if [ -n "$removals" ]; then
		log "installing $* removes these host packages: $removals"
	fi
	apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "$@" >/dev/null ||
		die "apt-get install $* failed (see above)"
}

need_tools=$(missing_tools)
if ! have_stack || [ -n "$need_tools" ]; then
	suite=$(tclone_host_suite)
	if [ "$suite" = bookworm ]; then
		tclone_have_suite trixie || tclone_add_suite trixie trixie 100 || true
		tclone_have_suite forky || tclone_add_suite forky forky 50 || true
	fi
	log "installing packages (podman, crun, conmon, criu and test tools)"
	apt-get update -qq
	apt_updated=1
	if [ -n "$need_tools" ]; then
		# shellcheck disable=SC2086
		apt_install_showing_removals $need_tools
	fi
	if ! have_stack; then
		if [ "$suite" = bookworm ]; then
			# Without recommends, and without trixie's own criu (4.1 is
			# replaced by forky's at once): 86 packages instead of 176, and
			# the host keeps its python3 and everything built on it.
			apt_install_showing_removals -t trixie podman crun conmon containernetworking-plugins \
				netavark aardvark-dns catatonit fuse-overlayfs nftables iptables
			# Forky's criu needs forky's libnl and libcompel and newer
			# gnutls; asking for them by suite one at a time leaves apt
			# removing bookworm's -dev packages instead, so the suite is
			# given for the whole transaction (it moves 7 libraries; forky's gnutls drops
			# libgnutlsxx30 and libgnutls-openssl27, which only bookworm's
			# libgnutls28-dev used).
			# libcriu2 is how crun reaches CRIU (it loads libcriu.so.2 at
			# run time), so it is named: recommends are off.
			apt_install_showing_removals -t forky criu libcriu2
		else
			apt_install_showing_removals podman crun conmon criu libcriu2 nftables iptables
		fi
	fi
	# Some library triggers are deferred in minimal images (no apt-utils);
	# without this, criu fails to find libnet.so.9 from the newer suite.
	ldconfig
	have_stack || die "podman 5, crun, conmon and criu >= 4.2 are still missing after installing; check the apt output above"
fi
# The REST tests fork over ssh:// through an sshd of their own, on loopback.
# openssh-server must match the host's openssh-client, which the step above
# takes from trixie on bookworm. Installing it must not start a system sshd
# (its package starts one where no policy says otherwise): a policy forbids
# it for the install.
# apt_install_no_service ARGS...: apt_install_showing_removals, with a
# policy that keeps the packages' services from starting (on machines
# without one of their own: ours runs no system service).
apt_install_no_service() {
	local policy=/usr/sbin/policy-rc.d made_policy=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		made_policy=1
	fi
	apt_install_showing_removals "$@"
	if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
}
if ! dpkg-query -W -f='${Status}' openssh-server 2>/dev/null | grep -q 'install ok installed'; then
	client_suite=$(apt-cache policy openssh-client | awk '/\*\*\*/ {getline; print $3; exit}')
	log "installing openssh-server (for the ssh:// REST test; no system sshd is started)"
	case "$client_suite" in
	trixie*) apt_install_no_service -t trixie openssh-server ;;
	*) apt_install_no_service openssh-server ;;
	esac
fi
# The Kubernetes tests' CRI runtime and registry: containerd 2 with its CRI
# plugin (only testing has 2.x; it comes with runc and moves nothing else)
# and Debian's OCI registry. hack/containerd.sh and hack/registry.sh run
# them.
have_containerd2() { command -v containerd >/dev/null && containerd --version 2>/dev/null | grep -q ' v\?2\.'; }
if ! have_containerd2 || ! command -v docker-registry >/dev/null; then
	# The step above updates apt's lists only when it installs.
	[ "${apt_updated:-0}" = 1 ] || apt-get update -qq
fi
if ! have_containerd2; then
	log "installing containerd 2 (the Kubernetes tests' CRI runtime; no service is started)"
	if [ "$(tclone_host_suite)" = bookworm ]; then
		apt_install_no_service -t forky containerd
	else
		apt_install_no_service containerd
	fi
fi
if ! command -v docker-registry >/dev/null; then
	log "installing docker-registry (the Kubernetes tests' local registry; no service is started)"
	apt_install_no_service docker-registry
fi
log "podman $(podman --version | awk '{print $3}'), crun $(crun --version | awk 'NR==1{print $3}'), criu $(criu --version | awk '/^Version:/{print $2}'), conmon $(conmon --version | awk 'NR==1{print $3}')"
# hack/check-fresh-setup.sh runs this step alone in a fresh machine's root.
if [ "${TCLONE_SETUP_PACKAGES_ONLY:-0}" = 1 ]; then
	log "done (packages only)"
	exit 0
fi

# --- 1b. tclone's CRIU --------------------------------------------------------
# The twin capture's plugin, and the host's CRIU version with one option
# more (lazy-pages-external: no page read while the source is held), built
# from Debian's source of the CRIU installed above; /usr/sbin/criu stays.
"$here/build-criu.sh"

# --- 1c. crictl ----------------------------------------------------------------
# cri-tools' crictl, the CRI client the Kubernetes tests and tclone kube
# fork use, which Debian does not package: built from its Go source (the
# module proxy's v1.34.0, the closest to containerd 2.1's CRI), in the
# background while the images build.
crictl_version=v1.34.0
crictl_pid=
if ! crictl --version 2>/dev/null | grep -q "$crictl_version"; then
	log "building crictl $crictl_version from cri-tools' source (in the background, about 2 minutes)"
	crictl_log=$(mktemp /var/tmp/tclone-crictl.XXXXXX.log)
	(cd / && GOFLAGS=-mod=mod GOBIN=/usr/local/bin go install \
		-ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
		"sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version") >"$crictl_log" 2>&1 &
	crictl_pid=$!
fi

# --- 2. cgroups --------------------------------------------------------------
# On hybrid hosts (v1 controllers plus a cgroup2 mount) crun refuses to run
# while any controller is still enabled on cgroup2. Only hugetlb is left there
# on these machines; giving it its own v1 hierarchy empties the v2 list.
# The memory hierarchy and the machine's own process_api groups are not touched.
unified=/sys/fs/cgroup/unified
if [ -f "$unified/cgroup.controllers" ] && [ -n "$(cat "$unified/cgroup.controllers")" ]; then
	for c in $(cat "$unified/cgroup.controllers"); do
		[ "$c" = hugetlb ] || die "cgroup2 still holds controller '$c'; crun cannot run on hybrid cgroups with it. Mount it as v1 or boot with pure cgroup v2"
	done
	log "moving hugetlb to a v1 hierarchy (crun refuses hybrid cgroup2 with controllers)"
	mkdir -p /sys/fs/cgroup/hugetlb
	mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
fi

# --- 3. sysctls --------------------------------------------------------------
# CRIU moves page data through pipes; without CAP_SYS_RESOURCE (not in this
# machine's bounding set) the per-user pipe quota makes large transfers fail
# with "page-pipe: tee: EPERM". Lifting the soft quota lets any user's pipes
# grow to pipe-max-size, which is the price of running CRIU here; hosts where
# CRIU keeps CAP_SYS_RESOURCE do not need it. Written to sysctl.d as well, so
# it survives a reboot.
set_sysctl() {
	local key=$1 want=$2
	if [ "$(sysctl -n "$key")" != "$want" ]; then
		log "sysctl $key=$want"
		sysctl -q -w "$key=$want"
	fi
}
set_sysctl fs.pipe-user-pages-soft 0
set_sysctl fs.pipe-max-size 67108864
sysctl_conf=/etc/sysctl.d/60-tclone-criu.conf
want_conf=$'# Written by tclone\'s hack/setup-host.sh: CRIU page transfers (see there).\nfs.pipe-user-pages-soft = 0\nfs.pipe-max-size = 67108864'
if [ "$(cat "$sysctl_conf" 2>/dev/null)" != "$want_conf" ]; then
	printf '%s\n' "$want_conf" >"$sysctl_conf"
fi

# --- 4. Images ---------------------------------------------------------------
# No registry is reachable, so the test images are built locally.
"$here/build-images.sh"

if [ -n "$crictl_pid" ]; then
	wait "$crictl_pid" || { tail -20 "$crictl_log" >&2; die "building crictl failed (log: $crictl_log)"; }
	rm -f "$crictl_log"
	log "crictl $(crictl --version | awk '{print $3}') installed in /usr/local/bin"
fi

# --- 5. tclone ---------------------------------------------------------------
bindir=${TCLONE_BINDIR:-$top/bin}
[ -x "$bindir/tclone" ] || die "$bindir/tclone is missing; run 'make build' first (make test and make demo do)"
"$here/install.sh" "$bindir"

# --- 6. Podman API service (optional) -----------------------------------------
# There is no systemd here; the service is started by hand for REST clients.
if [ "$start_service" = 1 ]; then
	"$here/podman-service.sh" start
fi
log "done"
