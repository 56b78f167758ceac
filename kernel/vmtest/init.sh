#!/bin/busybox sh
# PID 1 of the vma_cherrypick test VM. Loads the module, runs the suite,
# checks the kernel log, prints one verdict line and powers off. The host
# (kernel/vmtest/run.sh) reads the verdict and the log from the serial console.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc || exit 1
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

verdict() {
	echo "VCP-RESULT: $*"
	sync
	poweroff -f
	sleep 10
}

echo "VCP-KERNEL: $(uname -r)"
# hugetlb areas must exist for their refusal to be tested.
echo 4 >/proc/sys/vm/nr_hugepages
echo always >/sys/kernel/mm/transparent_hugepage/enabled

if ! insmod /vma_cherrypick.ko; then
	dmesg | tail -20
	verdict "FAIL module did not load"
fi
[ -c /dev/vma_cherrypick ] || verdict "FAIL /dev/vma_cherrypick missing after insmod"

/vcptest
rc=$?

# Unloading is part of the contract too (no leaked references).
rmmod vma_cherrypick || rc=1

dmesg >/tmp/dmesg.txt
echo "VCP-DMESG-BEGIN"
cat /tmp/dmesg.txt
echo "VCP-DMESG-END"
if grep -Eq 'BUG:|WARNING:|Oops|[Bb]ad page|rcu: INFO|detected stall|RCU stall|general protection fault|Call Trace|Kernel panic|list_(add|del) corruption' /tmp/dmesg.txt; then
	verdict "FAIL kernel log shows a BUG, WARNING, Oops, bad page or RCU stall"
fi
[ "$rc" = 0 ] || verdict "FAIL suite exited with $rc"
verdict "PASS"
