#!/usr/bin/env bash
# Runs one stage of make test within its time limit, and says how long it
# took. A stage that runs past its limit is stopped (TERM, then KILL 30 s
# later) and fails the run with a message that names it, well before CI's
# own limit cuts the whole run without saying where the time went.
#
#   hack/stage.sh NAME LIMIT COMMAND [ARG...]
#
# LIMIT is whole minutes, or whole seconds with an s (for its own test,
# hack/stage-test.sh).
#
# Each finished stage appends "NAME SECONDS LIMIT STATUS" to
# $TCLONE_STAGE_TIMES, when set (make test sets it, and prints the table).
set -uo pipefail

[ $# -ge 3 ] || { echo "usage: hack/stage.sh NAME LIMIT COMMAND [ARG...]" >&2; exit 2; }
name=$1 limit=$2
shift 2
case "$limit" in
*[!0-9]*s | s | '' | *[!0-9s]*) echo "stage.sh: the limit of stage $name must be whole minutes (or seconds: 30s), not '$limit'" >&2; exit 2 ;;
*s) limit_s=${limit%s} shown="$limit" ;;
*) limit_s=$((limit * 60)) shown="${limit}m" ;;
esac

start=$SECONDS
timeout --kill-after=30 "$limit_s" "$@"
status=$?
took=$((SECONDS - start))
if [ -n "${TCLONE_STAGE_TIMES:-}" ]; then
	echo "$name $took $limit $status" >>"$TCLONE_STAGE_TIMES"
fi
case $status in
124 | 137)
	echo "make test: stage $name ran past its limit of $shown and was stopped (after ${took}s); its output above shows where it was" >&2
	exit 124
	;;
0)
	echo "make test: stage $name took $((took / 60))m$((took % 60))s (limit $shown)"
	;;
*)
	echo "make test: stage $name failed (exit $status) after $((took / 60))m$((took % 60))s" >&2
	;;
esac
exit "$status"
