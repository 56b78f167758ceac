# vma_cherrypick: the kernel module, its Go bindings and its VM test.
# Included by the top-level Makefile; paths are relative to the repository.

KERNEL_DIR := kernel
# The kernels the module is built and tested against (see kernel/README.md).
KERNEL_VERSIONS ?= 6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64

.PHONY: kernel-test vm-test kernel-test-debug kernel-bench kernel-root kernel-module kernel-unit-test kernel-clean

# Boots each kernel under qemu with the module and the Go suite. The module is
# built in a Debian trixie root under kernel/_build (made once by mmdebstrap,
# kept until its package list changes), which also holds the kernels; the host
# only gets qemu, busybox-static, cpio and mmdebstrap from its own suite (root).
kernel-test: kernel-unit-test
	KVERS="$(KERNEL_VERSIONS)" GO="$(GO)" $(KERNEL_DIR)/vmtest/run.sh

# The whole-stack VM harness alone: kernel-test's stack stage, where the
# tclone binary forks bare bundles through crun and CRIU on pure cgroup v2
# with the module loaded (the fidelity suite, copy-on-write forks and their
# kill -9). kernel-test runs the same stage after the module's suite and the
# CRIU stage, so make test runs it with each kernel booted once; this target
# is for working on the stack without the rest.
vm-test:
	KVERS="$(KERNEL_VERSIONS)" GO="$(GO)" VCP_TESTS=version VCP_CRIU_TESTS= $(KERNEL_DIR)/vmtest/run.sh

# The suite on a kernel built from Debian's 6.12 linux-source with lockdep,
# KASAN, kmemleak, DEBUG_VM and DEBUG_PAGEALLOC
# (kernel/vmtest/build-debug-kernel.sh, cached in kernel/_build/debug-root).
# Not part of `make test`: the kernel build takes about 10 minutes and the
# run 20 to 25 (kernel/README.md). Time limits are stretched
# (KERNEL_DEBUG_SLOW: the stress test alone takes about 10 minutes), the
# debug kernel has no BTF (no pahole in its root), and timings mean nothing
# under KASAN, hence the skipped tests.
KERNEL_DEBUG_SLOW ?= 8
KERNEL_DEBUG_SKIP ?= -prototypes -benchmark-1g
kernel-test-debug: kernel-unit-test
	$(KERNEL_DIR)/vmtest/install-deps.sh
	set -e; out=$$($(KERNEL_DIR)/vmtest/build-debug-kernel.sh); \
	root=$$(echo "$$out" | sed -n 1p); release=$$(echo "$$out" | sed -n 2p); \
	VCP_ROOT=$$root VCP_SLOW=$(KERNEL_DEBUG_SLOW) VCP_TIMEOUT=$$((300 * $(KERNEL_DEBUG_SLOW))) \
	VCP_TESTS="$(KERNEL_DEBUG_SKIP)" VCP_CRIU_TESTS= VCP_STACK_TESTS= GO="$(GO)" $(KERNEL_DIR)/vmtest/run.sh $$release

# The copy-on-write figures in the VM, on each kernel: the module's
# snapshot and cherrypick of 1 GiB beside fork(), and BenchmarkCRIUCow
# (criuhooks/lazypages: the source's pause across a copy-on-write and a
# copying CRIU dump, the sibling's first answer for each memory mode and its
# PSS, at 1 MiB and 1 GiB, and the pause's growth with processes), written
# into BENCHMARKS.md's "Copy-on-write in the VM" (make bench keeps it).
# Not part of make test: figures, not checks. See kernel/README.md.
kernel-bench:
	{ KVERS="$(KERNEL_VERSIONS)" GO="$(GO)" VCP_TESTS="version benchmark-1g snapshot-benchmark-1g" \
	VCP_CRIU_TESTS='^$$' VCP_STACK_TESTS= VCP_CRIU_BENCH=CRIUCow VCP_TIMEOUT=900 $(KERNEL_DIR)/vmtest/run.sh; \
		echo $$? >$(KERNEL_DIR)/_build/kernel-bench.rc; } 2>&1 | tee $(KERNEL_DIR)/_build/kernel-bench.out
	exit $$(cat $(KERNEL_DIR)/_build/kernel-bench.rc)
	$(KERNEL_DIR)/vmtest/bench-md.sh $(KERNEL_DIR)/_build/kernel-bench.out BENCHMARKS.md

# Only the trixie build root (kernel/_build/trixie-root).
kernel-root:
	$(KERNEL_DIR)/vmtest/install-deps.sh
	KVERS="$(KERNEL_VERSIONS)" $(KERNEL_DIR)/vmtest/build-root.sh >/dev/null

# The bindings' tests that need no module.
kernel-unit-test:
	$(GO) test -count=1 ./$(KERNEL_DIR)/cherrypick/

# Builds the module for the running kernel, or KDIR=/path/to/headers.
kernel-module:
	$(MAKE) -C $(KERNEL_DIR)/vma_cherrypick $(if $(KDIR),KDIR=$(KDIR))

kernel-clean:
	rm -rf $(KERNEL_DIR)/_build
	cd $(KERNEL_DIR)/vma_cherrypick && rm -f *.o *.ko *.mod *.mod.c .*.cmd modules.order Module.symvers
