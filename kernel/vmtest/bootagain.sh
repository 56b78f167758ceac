# Sourced by run.sh (host, bash), after logcheck.sh: the boot-again rule.
#
# emulator_fault CONSOLE: the VM's log shows a fault of the emulator's and
# nothing else, and the VM is booted again (up to three boots in all). The
# faults it forgives, each only when it explains every problem in the log:
# - a kernel that died before init ran, so before the module or the suite
#   did anything: under TCG with two vCPUs the stock kernels now and then
#   take an int3 Oops while patching their own text (static keys), at boot
#   (enqueue_task_fair from dquot_init);
# - an int3 Oops at any point, the same fault later: init.sh holds a perf
#   event so that CRIU's breakpoints no longer make the kernel patch
#   __schedule (where all of them were seen), but other keys may flip; the
#   panic that may follow it, and RCU stalls of what the dead task held;
# - a VM the host starved: the guest's clocksource watchdog found a clock
#   read taking far too long (the emulator did not run), and the log shows
#   nothing but the stalls that follow (an RCU stall, a soft lockup of a
#   vCPU that did not run, their traces). Seen once, on 7.3, with the host
#   at a load of 10 and 100% iowait: a 98 s "soft lockup" in kcompactd's
#   idle loop.
# Whatever else the log shows fails the run instead (vcp_bootagain_blockers
# prints it): a failed test, a BUG or a WARNING, a frame of the module's in
# any trace, a sanitizer's report, a leak; or a kernel problem none of the
# faults above explains (another kind of Oops after init, a bad page, a
# list corruption).
emulator_fault() {
	local bad allowed base='^VCP-RESULT: |Call Trace'
	bad=$(vcp_log_bad "$1") || return 1
	[ -z "$(vcp_bootagain_blockers "$1")" ] || return 1
	allowed=$base
	if ! grep -q '^VCP-KERNEL: ' "$1"; then
		allowed="$allowed|Oops|general protection fault|Kernel panic"
	fi
	if grep -q 'Oops: int3' "$1"; then
		allowed="$allowed|Oops: int3|Kernel panic - not syncing: (Fatal exception|Attempted to kill)|rcu: INFO: .*detected stalls"
	fi
	if vcp_starved "$1"; then
		allowed="$allowed|rcu: INFO: .*detected stalls|BUG: soft lockup|Kernel panic - not syncing: softlockup"
	fi
	[ "$allowed" != "$base" ] || return 1
	! printf '%s\n' "$bad" | grep -v -E "$allowed" | grep -q .
}

# vcp_starved CONSOLE: the guest's clocksource watchdog saw the emulator not
# run.
vcp_starved() {
	grep -q 'clocksource: Watchdog .*read timed out' "$1"
}

# vcp_bootagain_blockers CONSOLE prints the lines that no fault of the
# emulator's explains, wherever they are: a test's failure (go test's
# "--- FAIL" and "FAIL", vcptest's "FAIL name", a stage's "VCP-UNLOAD:
# FAIL"; not the guest's verdict line, which follows from what it saw), a
# BUG or a WARNING (a soft lockup is the starved host's, where the watchdog
# says so), a frame of the module's in a trace, a KASAN or UBSAN report, an
# object kmemleak found unreferenced.
vcp_bootagain_blockers() {
	local lines
	lines=$(grep -v '^VCP-RESULT: ' "$1" |
		grep -E '(^|[^A-Za-z])FAIL([^A-Za-z]|$)|BUG:|WARNING:|\[vma_cherrypick\]|KASAN:|UBSAN:|^unreferenced object ') || return 0
	if vcp_starved "$1"; then
		printf '%s\n' "$lines" | grep -v 'BUG: soft lockup' || true
	else
		printf '%s\n' "$lines"
	fi
}
