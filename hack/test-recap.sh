#!/usr/bin/env bash
# Prints, after a failed `go test -v` run, each failed test with the last
# lines its test file logged (file.go:NN: ...), so that the end of a long
# run's output says why each test failed, however much of the middle a
# reader (or CI's summary) leaves out. A run that failed without naming a
# test (a -timeout panic, a build failure) gets its own lines instead.
#
#   hack/test-recap.sh LOG
set -uo pipefail
[ $# -eq 1 ] && [ -r "$1" ] || { echo "usage: hack/test-recap.sh LOG" >&2; exit 2; }
awk -v keep=12 '
	/^=== (RUN|CONT|PAUSE|NAME) +[^ ]/ { cur = $3; next }
	/^ *--- FAIL: / { failed[++n] = $3; next }
	/^    +[^ ]+\.go:[0-9]+: / {
		if (cur != "") { line[cur, count[cur] % keep] = $0; count[cur]++ }
		next
	}
	/^panic: |^FAIL\t|\[build failed\]|^running tests:|^\t[A-Za-z0-9_\/]+ \([0-9.a-z]+\)$|^[^ ]+\.go:[0-9]+:[0-9]+: / { other[++m] = $0 }
	END {
		if (n > 0) {
			printf "\n%d failed tests, with the last lines each logged (up to %d):\n", n, keep
			for (i = 1; i <= n; i++) {
				name = failed[i]; c = count[name]
				printf "--- %s\n", name
				for (j = (c > keep ? c - keep : 0); j < c; j++) print line[name, j % keep]
			}
		} else if (m > 0) {
			printf "\nthe run failed without a --- FAIL line; what it said:\n"
			for (i = 1; i <= m && i <= 40; i++) print other[i]
		}
	}
' "$1"
