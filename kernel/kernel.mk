# vma_cherrypick: the kernel module, its Go bindings and its VM test.
# Included by the top-level Makefile; paths are relative to the repository.

KERNEL_DIR := kernel
# The kernels the module is built and tested against (see kernel/README.md).
KERNEL_VERSIONS ?= 6.12.117+deb13-cloud-amd64 7.3.4+deb13-cloud-amd64

.PHONY: kernel-test kernel-module kernel-unit-test kernel-clean

# Boots each kernel under qemu with the module and the Go suite; installs the
# kernels, headers, qemu and busybox first when they are missing (root).
kernel-test: kernel-unit-test
	KVERS="$(KERNEL_VERSIONS)" GO="$(GO)" $(KERNEL_DIR)/vmtest/run.sh

# The bindings' tests that need no module.
kernel-unit-test:
	$(GO) test -count=1 ./$(KERNEL_DIR)/cherrypick/

# Builds the module for the running kernel, or KDIR=/path/to/headers.
kernel-module:
	$(MAKE) -C $(KERNEL_DIR)/vma_cherrypick $(if $(KDIR),KDIR=$(KDIR))

kernel-clean:
	rm -rf $(KERNEL_DIR)/_build
	cd $(KERNEL_DIR)/vma_cherrypick && rm -f *.o *.ko *.mod *.mod.c .*.cmd modules.order Module.symvers
