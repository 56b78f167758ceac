#!/usr/bin/env bash
# Checks the boot-again rule (bootagain.sh) on saved consoles: each file in
# testdata/consoles is named by what run.sh must do with it:
#   retry-*  the VM is booted again (a fault of the emulator's alone);
#   fail-*   it is not, and the run fails (the kernel log check or the
#            guest's verdict catches it);
#   pass-*   it is not, and the run passes.
# Exits non-zero on any console judged otherwise.
#
#   kernel/vmtest/bootagain-test.sh [CONSOLE...]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/logcheck.sh"
. "$here/bootagain.sh"

# run_fails CONSOLE: run.sh's checks after the boots fail the run.
run_fails() {
	vcp_log_bad "$1" >/dev/null && return 0
	[ "$(grep -E '^VCP-RESULT: ' "$1" | tail -1 || true)" != "VCP-RESULT: PASS" ]
}

if [ $# -gt 0 ]; then
	consoles=("$@")
else
	consoles=("$here"/testdata/consoles/*.txt)
fi
bad=0
n=0
for c in "${consoles[@]}"; do
	[ -f "$c" ] || { echo "bootagain-test: no console $c" >&2; exit 1; }
	name=$(basename "$c" .txt)
	n=$((n + 1))
	retry=no
	emulator_fault "$c" && retry=yes
	fails=no
	run_fails "$c" && fails=yes
	case "$name" in
	retry-*) want="retry=yes" ;;
	fail-*) want="retry=no fails=yes" ;;
	pass-*) want="retry=no fails=no" ;;
	*) echo "bootagain-test: $name: the name says neither retry-, fail- nor pass-" >&2; bad=$((bad + 1)); continue ;;
	esac
	got="retry=$retry fails=$fails"
	ok=1
	for w in $want; do
		case " $got " in *" $w "*) ;; *) ok=0 ;; esac
	done
	if [ "$ok" = 1 ]; then
		echo "ok   $name ($got)"
	else
		echo "FAIL $name: want $want, got $got" >&2
		if [ "$retry" = no ]; then
			vcp_bootagain_blockers "$c" | head -5 | sed 's/^/     blocked by: /' >&2
		fi
		bad=$((bad + 1))
	fi
done
[ "$n" -gt 0 ] || { echo "bootagain-test: no consoles" >&2; exit 1; }
echo "bootagain-test: $((n - bad)) of $n consoles judged as named"
[ "$bad" = 0 ]
