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
