#!/usr/bin/env bash
# Runs a command with the local registry and tclone's containerd up
# (hack/registry.sh, hack/containerd.sh), for the benchmark's forks through
# the CRI, and stops afterwards whichever of the two it started. One that
# does not start is reported, and the command runs all the same: what needs
# it fails there, saying so, and the rest is measured.
#
#   hack/with-kube.sh COMMAND [ARG...]
#
# Environment: TCLONE_BINDIR, where tclone is (default /usr/local/bin).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }

started=()
stop() {
	local s
	for s in "${started[@]}"; do "$here/$s.sh" stop; done
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
# The registry first: containerd pulls the pods' sandbox image from it.
for s in registry containerd; do
	if ! "$here/$s.sh" status >/dev/null 2>&1; then
		# Recorded before the start: a start that fails half-way is
		# stopped too.
		started=("$s" "${started[@]}")
		"$here/$s.sh" start || echo "with-kube.sh: $s did not start; the command runs without it" >&2
	fi
done
"$@"
