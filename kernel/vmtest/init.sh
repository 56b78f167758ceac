#!/bin/busybox sh
# PID 1 of the vma_cherrypick test VM. Loads the module, runs the suite,
# checks the kernel log, prints one verdict line and stops the VM. The host
# (kernel/vmtest/run.sh) reads the verdict and the log from the serial console.
# First, the initramfs moves to a tmpfs and becomes the root there: crun
# cannot pivot_root away from the initramfs's rootfs, which is no mount.
if [ ! -e /.vcp-switched ]; then
	/bin/busybox mkdir -p /newroot
	/bin/busybox mount -t tmpfs -o size=90% tmpfs /newroot
	for f in /*; do
		[ "$f" = /newroot ] || /bin/busybox cp -a "$f" /newroot/
	done
	/bin/busybox touch /newroot/.vcp-switched
	exec /bin/busybox switch_root /newroot /init
fi
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc || exit 1
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Pseudo-terminals, which criu check (tclone's fork runs it) wants to open.
mkdir -p /dev/pts
mount -t devpts -o ptmxmode=0666 devpts /dev/pts
[ -e /dev/ptmx ] || ln -s pts/ptmx /dev/ptmx
mount -t tmpfs tmpfs /tmp

# Stops the VM: run.sh starts qemu with -no-reboot, so a reboot ends it. Not
# poweroff: that needs ACPI, which the debug kernel (tinyconfig) has not.
verdict() {
	echo "VCP-RESULT: $*"
	sync
	reboot -f
	sleep 10
}

. /logcheck.sh
# wait_file FILE: waits up to 10 s for FILE to exist.
wait_file() {
	for i in $(seq 100); do
		[ -e "$1" ] && return 0
		sleep 0.1
	done
	return 1
}
echo "VCP-KERNEL: $(uname -r)"
# One per-task perf event held for the whole run: the kernel switches its
# perf_sched_events static key on now, while nothing else runs, and never
# again (vcptest's holdPerfEvent says why: CRIU's ptrace breakpoints would
# switch it on and off around every restore, each time patching __schedule
# through int3, which two TCG vCPUs sometimes turn into an Oops).
/vcptest hold-perf-event /tmp/perf-held &
wait_file /tmp/perf-held || echo "VCP-PERF: the perf event holder did not start; int3 Oopses are likelier"
# hugetlb areas must exist for their refusal to be tested.
echo 4 >/proc/sys/vm/nr_hugepages
echo always >/sys/kernel/mm/transparent_hugepage/enabled

# Swap on the disk run.sh attaches (NVMe: built into the cloud kernels), for
# the suite's reclaim tests. The controller shows up asynchronously.
for i in 1 2 3 4 5 6 7 8 9 10; do
	[ -b /dev/nvme0n1 ] && break
	sleep 0.5
done
if [ -b /dev/nvme0n1 ]; then
	mkswap /dev/nvme0n1 >/dev/null && swapon /dev/nvme0n1 || echo "VCP-SWAP: swapon failed"
else
	echo "VCP-SWAP: no swap disk"
fi

# The series allowlist: a build that believes this kernel untested must
# refuse to load, and load with the override.
if insmod /vcp_untested.ko 2>/dev/null; then
	rmmod vma_cherrypick
	verdict "FAIL a module built for an untested series loaded without allow_untested_kernel"
fi
dmesg | grep -q 'is not one this module was tested on' ||
	verdict "FAIL the untested-series refusal did not say why in the kernel log"
insmod /vcp_untested.ko allow_untested_kernel=1 ||
	verdict "FAIL allow_untested_kernel=1 did not override the series check"
rmmod vma_cherrypick || verdict "FAIL rmmod of the untested-series build"
echo "VCP-ALLOWLIST: refused without the override, loaded with it"

# kmemleak (the debug kernel has it): what boot and the checks above left
# unreferenced is forgotten, so that only what the module and the suite leak
# is reported at the end.
kmemleak=/sys/kernel/debug/kmemleak
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
if [ -w "$kmemleak" ]; then
	echo scan >"$kmemleak" && echo clear >"$kmemleak" ||
		verdict "FAIL kmemleak did not scan"
else
	kmemleak=
fi

if ! insmod /vma_cherrypick.ko; then
	dmesg | tail -20
	verdict "FAIL module did not load"
fi
[ -c /dev/vma_cherrypick ] || verdict "FAIL /dev/vma_cherrypick missing after insmod"

/vcptest
rc=$?

# What the CRIU and the stack stages (run.sh) need: the network modules
# CRIU's feature detection and its dump of a network namespace use, and
# loopback up (CRIU's feature detection connects over it: TCP repair).
if [ -d /criu-modules ]; then
	mkdir -p /dev/shm /run
	mount -t tmpfs tmpfs /dev/shm
	mount -t tmpfs tmpfs /run
	ip link set lo up
	for m in $(cat /criu-modules/list); do
		insmod "/criu-modules/$m.ko" || echo "VCP-CRIU: insmod $m failed"
	done
	echo "VCP-CRIU: $(PATH=/usr/sbin:/bin criu --version | head -1)"
fi

# The CRIU stage: copy-on-write dumps and lazy restores with the root's criu
# and the module still loaded. Its output is indented, for run.sh's summary;
# a failure fails the run, and so does a selection that ran no test for one
# of its alternatives (a test renamed or removed: vcp_selection_missing).
if [ -x /lazypages.test ]; then
	bench=$(cat /criu-bench)
	PATH=/usr/sbin:/bin TCLONE_REQUIRE=1 TCLONE_REQUIRE_MODULE=1 \
		TCLONE_LAZYPAGES_HELPERS=/helpers \
		/lazypages.test -test.v -test.timeout 600s -test.run "$(cat /criu-tests)" \
		${bench:+-test.bench "$bench" -test.benchtime 1x} >/tmp/criu.out 2>&1
	crc=$?
	sed 's/^/  criu: /' /tmp/criu.out
	if [ "$crc" != 0 ]; then
		echo "VCP-CRIU: the CRIU stage failed (exit $crc)"
		rc=1
	fi
	if missing=$(vcp_selection_missing "$(cat /criu-tests)" /tmp/criu.out); then
		echo "VCP-CRIU: the CRIU stage ran no test for: $(echo "$missing" | tr '\n' ' ')"
		rc=1
	fi
fi

# The stack stage: runtime-level forks of bare bundles through the tclone
# binary, crun and CRIU, on pure cgroup v2. A failure fails the run, as does
# a selection that ran no test for one of its alternatives; the CRIU logs
# tclone kept of a failed dump or restore are shown (their end).
if [ -x /integration.test ]; then
	[ -e /sys/fs/cgroup/cgroup.procs ] || mount -t cgroup2 cgroup2 /sys/fs/cgroup
	echo "+cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control ||
		echo "VCP-STACK: could not enable the cpu, memory and pids controllers"
	mkdir -p /var/tmp /var/lib /etc
	PATH=/usr/bin:/usr/sbin:/bin TCLONE_REQUIRE=1 TCLONE_REQUIRE_MODULE=1 TCLONE_BINDIR=/stack/bin \
		TCLONE_TEST_ROOTFS=/stack/rootfs TCLONE_FIDELITY_MEM_MIB=32 \
		/integration.test -test.v -test.timeout 600s -test.run "$(cat /stack-tests)" >/tmp/stack.out 2>&1
	src=$?
	sed 's/^/  stack: /' /tmp/stack.out
	if [ "$src" != 0 ]; then
		echo "VCP-STACK: the stack stage failed (exit $src)"
		for log in $(find /var/log/tclone -name '*.log' 2>/dev/null | head -3); do
			echo "VCP-STACK: kept CRIU log $log (its last 60 lines):"
			tail -60 "$log" | sed 's/^/  stack-log: /'
		done
		rc=1
	fi
	if missing=$(vcp_selection_missing "$(cat /stack-tests)" /tmp/stack.out); then
		echo "VCP-STACK: the stack stage ran no test for: $(echo "$missing" | tr '\n' ' ')"
		rc=1
	fi
fi

# A snapshot's release runs the module's code: while one exists (its
# holder has closed the device, and its source is gone), rmmod must refuse.
/vcptest hold-snapshot /tmp/snapshot-held &
holder=$!
if ! wait_file /tmp/snapshot-held; then
	echo "VCP-UNLOAD: FAIL the snapshot holder did not start"
	rc=1
elif rmmod vma_cherrypick 2>/dev/null; then
	echo "VCP-UNLOAD: FAIL rmmod succeeded while a snapshot was open"
	rc=1
	insmod /vma_cherrypick.ko
else
	echo "VCP-UNLOAD: rmmod refused while a snapshot is open"
fi
kill "$holder"
wait "$holder" || { echo "VCP-UNLOAD: FAIL the snapshot holder failed"; rc=1; }

# Every object allocated since the clear above that nothing points to any
# more is a leak: by the module, or by the kernel on a path the module
# drives. kmemleak reports objects older than 5 s only, and a second scan
# drops those a first one saw in transit. Scanned with the module loaded
# (its functions are named in the backtraces only then) and after rmmod
# (what unloading leaves).
kmemleak_scan() {
	sleep 6
	echo scan >"$kmemleak" && echo scan >"$kmemleak" || verdict "FAIL kmemleak did not scan"
	leaks=$(grep -c '^unreferenced object' "$kmemleak")
}
leaks=0
if [ -n "$kmemleak" ]; then
	kmemleak_scan
	[ "$leaks" = 0 ] || cat "$kmemleak"
fi

# Unloading is part of the contract too (no leaked references).
rmmod vma_cherrypick || rc=1

if [ -n "$kmemleak" ]; then
	loaded=$leaks
	kmemleak_scan
	echo "VCP-KMEMLEAK: $loaded unreferenced objects with the module loaded, $leaks after rmmod"
	[ "$leaks" = "$loaded" ] || cat "$kmemleak"
fi

dmesg >/tmp/dmesg.txt
echo "VCP-DMESG-BEGIN"
cat /tmp/dmesg.txt
echo "VCP-DMESG-END"
if vcp_log_bad /tmp/dmesg.txt >/dev/null; then
	verdict "FAIL kernel log shows a BUG, WARNING, Oops, bad page or RCU stall"
fi
[ "$rc" = 0 ] || verdict "FAIL suite exited with $rc"
[ "$leaks" = 0 ] || verdict "FAIL kmemleak found $leaks unreferenced objects"
verdict "PASS"
