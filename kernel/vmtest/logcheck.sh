# Sourced by run.sh (host) and init.sh (guest, busybox): the kernel log check.
#
# vcp_log_bad FILE prints the lines of FILE that show a kernel problem and
# returns 0 if there is any. An OOM report the suite provokes on purpose
# (between its two marker lines) has a stack dump; its "Call Trace" is
# excused there and nowhere else, and a BUG or WARNING inside still counts.
vcp_bad_kernel_log='BUG:|WARNING:|UBSAN:|Oops|[Bb]ad page|rcu: INFO|detected stall|RCU stall|general protection fault|Call Trace|Kernel panic|list_(add|del) corruption'

vcp_log_bad() {
	awk '/vcptest: expected OOM report begins/ { oom = 1 }
	     /vcptest: expected OOM report ends/ { oom = 0 }
	     !(oom && /Call Trace/)' "$1" | grep -E "$vcp_bad_kernel_log"
}

# vcp_selection_missing PATTERN FILE: FILE holds a go test binary's
# -test.v output for -test.run PATTERN. Prints each alternative of PATTERN
# (split at its top-level "|"; of each, what names a top-level test, before
# any "/") that no test that ran matches, and returns 0 if there is any: a
# renamed or removed test, or a binary that stopped before it, cannot pass
# for a selection that ran. "^$" selects no test on purpose and needs none.
# Go's and awk's regular expressions agree on test names and "^", "$",
# "|" and groups.
vcp_selection_missing() {
	[ "$1" = '^$' ] && return 1
	awk -v pat="$1" '
	BEGIN {
		n = 0; depth = 0; cur = ""
		for (i = 1; i <= length(pat); i++) {
			c = substr(pat, i, 1)
			if (c == "\\") { cur = cur c substr(pat, i + 1, 1); i++; continue }
			if (c == "(") depth++
			if (c == ")") depth--
			if (c == "|" && depth == 0) { alt[++n] = cur; cur = ""; continue }
			cur = cur c
		}
		alt[++n] = cur
		for (i = 1; i <= n; i++) {
			top = alt[i]
			sub(/\/.*/, "", top)
			want[i] = top
		}
	}
	$1 == "===" && $2 == "RUN" && $3 !~ /\// {
		for (i = 1; i <= n; i++)
			if ($3 ~ want[i]) seen[i] = 1
	}
	END {
		missing = 0
		for (i = 1; i <= n; i++)
			if (!seen[i]) { print alt[i]; missing = 1 }
		exit !missing
	}' "$2"
}

# vcp_recap V CONSOLE RECAP: after a failed run of kernel V, each Go stage's
# failed tests with the last lines they logged (RECAP: hack/test-recap.sh),
# so that the end of the output says which test failed and why, however
# much of the middle a reader (or CI's summary) leaves out.
vcp_recap() {
	local stage out
	for stage in criu stack; do
		out=$(sed -n "s/^  $stage: //p" "$2" | "$3" /dev/stdin)
		[ -n "$out" ] && printf '%s\n' "$out" | sed "/^\$/d; s/^/kernel-test: [$1] $stage: /"
	done
	return 0
}
