#!/usr/bin/env bash
# Checks hack/stage.sh: a stage within its limit passes its status on and
# says how long it took; one past its limit is stopped and fails naming
# itself; a bad limit is refused. And hack/test-recap.sh: a failed test's
# logged lines, and only a failed test's, are recapped. About 3 seconds.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Its stages are its own, not the run's that may be recording its own.
unset TCLONE_STAGE_TIMES
bad=0
check() { # NAME WANT_STATUS WANT_TEXT STATUS OUTPUT
	if [ "$4" = "$2" ] && printf '%s' "$5" | grep -q -- "$3"; then
		echo "ok   $1"
	else
		echo "FAIL $1: exit $4 (want $2), output: $5" >&2
		bad=$((bad + 1))
	fi
}
out=$("$here/stage.sh" quick 1 true 2>&1); check within-limit 0 "stage quick took 0m" $? "$out"
out=$("$here/stage.sh" failing 1 sh -c 'exit 3' 2>&1); check failure-passed-on 3 "stage failing failed (exit 3)" $? "$out"
out=$("$here/stage.sh" slow 1s sleep 30 2>&1); check past-limit 124 "stage slow ran past its limit of 1s" $? "$out"
out=$("$here/stage.sh" typo 5x true 2>&1); check bad-limit 2 "must be whole minutes" $? "$out"
times=$(mktemp)
TCLONE_STAGE_TIMES=$times "$here/stage.sh" recorded 2 true >/dev/null
out=$(cat "$times"); rm -f "$times"; check recorded 0 "^recorded 0 2 0$" 0 "$out"
log=$(mktemp)
printf '%s\n' '=== RUN   TestGood' '    good_test.go:1: fine' '--- PASS: TestGood (0.01s)' \
	'=== RUN   TestBad' '    bad_test.go:7: the reason' '--- FAIL: TestBad (0.02s)' 'FAIL' >"$log"
out=$("$here/test-recap.sh" "$log"); status=$?
check recap-names-reason 0 "bad_test.go:7: the reason" $status "$out"
if printf '%s' "$out" | grep -q good_test.go; then check recap-only-failed 0 "" 1 "$out"; else echo "ok   recap-only-failed"; fi
{
	echo '=== RUN   TestLong'
	for i in $(seq 20); do echo "    long_test.go:$i: round $i"; done
	echo '    long_test.go:99: the late reason'
	echo '=== RUN   TestLong/sub'
	echo '    long_test.go:50: a subtest line'
	echo '=== NAME  TestLong'
	echo '    long_test.go:60: the parent again'
	echo '    --- PASS: TestLong/sub (0.01s)'
	echo '--- FAIL: TestLong (1.00s)'
} >"$log"
out=$("$here/test-recap.sh" "$log"); status=$?
check recap-keeps-last-lines 0 "long_test.go:99: the late reason" $status "$out"
check recap-follows-name-lines 0 "long_test.go:60: the parent again" $status "$out"
printf '%s\n' '=== RUN   TestHang' 'panic: test timed out after 40m0s' 'running tests:' '	TestHang (40m0s)' 'FAIL	example.com/x	2400.1s' >"$log"
out=$("$here/test-recap.sh" "$log"); status=$?
check recap-timeout 0 "panic: test timed out after 40m0s" $status "$out"
check recap-timeout-names-test 0 "TestHang (40m0s)" $status "$out"
printf '%s\n' '=== RUN   TestGood' '--- PASS: TestGood (0.01s)' 'PASS' >"$log"
out=$("$here/test-recap.sh" "$log"); status=$?
if [ "$status" = 0 ] && [ -z "$out" ]; then echo "ok   recap-silent-when-passed"; else check recap-silent-when-passed 0 "^$" 1 "$out"; fi
rm -f "$log"
[ "$bad" = 0 ] && echo "stage-test: all checks as named"
exit "$bad"
