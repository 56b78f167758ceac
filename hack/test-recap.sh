#!/usr/bin/env bash
# Prints, after a failed `go test -v` run, each failed test with the lines
# its test file logged (file.go:NN: ...), so that the end of a long run's
# output says why each test failed, however much of the middle a reader
# (or CI's summary) leaves out.
#
#   hack/test-recap.sh LOG
set -uo pipefail
[ $# -eq 1 ] && [ -r "$1" ] || { echo "usage: hack/test-recap.sh LOG" >&2; exit 2; }
awk '
	/^=== (RUN|CONT|PAUSE)  *[^ ]/ { cur = $3; next }
	/^ *--- FAIL: / {
		name = $3
		failed[++n] = name
		next
	}
	/^    +[^ ]+\.go:[0-9]+: / {
		if (cur != "" && count[cur] < 12) { lines[cur] = lines[cur] $0 "\n"; count[cur]++ }
		next
	}
	END {
		if (n == 0) exit
		printf "\n%d failed tests, with what each logged (up to 12 lines each):\n", n
		for (i = 1; i <= n; i++) {
			printf "--- %s\n%s", failed[i], lines[failed[i]]
		}
	}
' "$1"
