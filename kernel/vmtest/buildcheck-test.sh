#!/usr/bin/env bash
# Tests build-module.sh's check itself: for each kernel, a module with a
# compiler warning and one with a modpost warning (a section mismatch) must
# each be refused, and a clean module must build. Also tests vma_cherrypick's
# own build-time check: a copy of it that calls a kernel function with the
# wrong prototype must not build.
#
#   kernel/vmtest/buildcheck-test.sh ROOT WORK_DIR
#
# Environment:
#   KVERS   kernel versions (default: the two the suite supports)
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 ROOT WORK_DIR" >&2; exit 64; }
here=$(cd "$(dirname "$0")" && pwd)
root=$1 work=$2
KVERS=${KVERS:-"6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64"}

log() { printf 'kernel-buildcheck: %s\n' "$*"; }

rm -rf "$work"
mkdir -p "$work"

# module NAME BODY: a one-file module whose init and exit are given. Built
# with the compiler the kernel was built with, named in its .config as
# vma_cherrypick's Makefile takes it (Debian's kernels: x86_64-linux-gnu-gcc-14;
# the debug kernel: gcc-14).
module() {
	mkdir -p "$work/src/$1"
	printf 'obj-m := %s.o\nifeq ($(KERNELRELEASE),)\nKCC := $(shell sed -n %s $(KDIR)/.config)\nmodules:\n\t$(MAKE) -C $(KDIR) M=$(CURDIR) CC=$(KCC) modules\nendif\n' \
		"$1" "'s/^CONFIG_CC_VERSION_TEXT=\"\([^ ]*\) .*/\1/p'" >"$work/src/$1/Makefile"
	{
		printf '#include <linux/module.h>\n#include <linux/init.h>\n'
		printf '%s\n' "$2"
		printf 'MODULE_LICENSE("GPL");\nMODULE_DESCRIPTION("tclone build check %s");\n' "$1"
	} >"$work/src/$1/$1.c"
}

module clean '
static int __init clean_init(void) { return 0; }
static void __exit clean_exit(void) { }
module_init(clean_init);
module_exit(clean_exit);'

# gcc: -Wunused-function (kbuild enables -Wall).
module ccwarn '
static int unused_helper(void) { return 1; }
static int __init ccwarn_init(void) { return 0; }
static void __exit ccwarn_exit(void) { }
module_init(ccwarn_init);
module_exit(ccwarn_exit);'

# modpost: data that outlives init pointing into .init.text, which is freed
# after load: "WARNING: modpost: ...: section mismatch in reference: ...".
module mismatch '
static int __init only_at_init(void) { return 1; }
int (*mismatch_later)(void) = only_at_init;
EXPORT_SYMBOL(mismatch_later);
static int __init mismatch_init(void) { return 0; }
static void __exit mismatch_exit(void) { }
module_init(mismatch_init);
module_exit(mismatch_exit);'

# vma_cherrypick calling ptrace_may_access(task, unsigned long): the kernel
# declares unsigned int.
mkdir -p "$work/src/badproto"
cp "$here/../vma_cherrypick"/*.[chS] "$here/../vma_cherrypick/Makefile" "$work/src/badproto/"
sed -i 's/^VCP_FN(bool, ptrace_may_access, struct task_struct \*, unsigned int)$/VCP_FN(bool, ptrace_may_access, struct task_struct *, unsigned long)/' \
	"$work/src/badproto/vcp_syms.h"
grep -q 'ptrace_may_access, struct task_struct \*, unsigned long' "$work/src/badproto/vcp_syms.h" ||
	{ log "FAIL: could not plant a wrong prototype in a copy of vcp_syms.h"; exit 1; }

failed=0
expect() {
	local v=$1 name=$2 want=$3 rc=0
	"$here/build-module.sh" "$root" "$v" "$work/src/$name" "$work/$v/$name" 2>"$work/$v-$name.err" || rc=$?
	if [ "$rc" = "$want" ]; then
		return 0
	fi
	cat "$work/$v-$name.err" >&2
	log "FAIL: $v: module '$name': build-module.sh exited $rc, want $want"
	failed=$((failed + 1))
}

for v in $KVERS; do
	expect "$v" clean 0
	expect "$v" ccwarn 2
	grep -q 'warning: .unused_helper. defined but not used' "$work/$v/ccwarn/build.log" ||
		{ log "FAIL: $v: ccwarn's log lacks gcc's unused-function warning"; failed=$((failed + 1)); }
	expect "$v" mismatch 2
	grep -q '^WARNING: modpost: .*section mismatch' "$work/$v/mismatch/build.log" ||
		{ log "FAIL: $v: mismatch's log lacks modpost's section-mismatch WARNING"; failed=$((failed + 1)); }
	expect "$v" badproto 1
	grep -q 'ptrace_may_access() differs from the prototype' "$work/$v/badproto/build.log" ||
		{ log "FAIL: $v: the wrong prototype was not reported by vcp_protocheck.c"; failed=$((failed + 1)); }
done
[ "$failed" = 0 ] || { log "the build check does not catch what it must ($failed failures)"; exit 1; }
log "the build check refuses compiler and modpost warnings, and vma_cherrypick a wrong prototype, on: $KVERS"
