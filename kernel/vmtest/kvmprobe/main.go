// Command kvmprobe says whether qemu can use KVM here: it does not ask
// whether /dev/kvm opens, but whether a virtual CPU really runs. It creates
// a VM with one page of memory holding a HLT instruction, points a vCPU at
// it in real mode, runs it, and expects the vCPU to stop on that HLT.
//
// It prints "kvm" and exits 0 when it did, or prints "tcg: <why>" and exits
// 1 (no /dev/kvm, a VM that cannot be made, a vCPU that fails to run or
// stops for another reason). A vCPU that never stops is the caller's to
// bound (run.sh runs the probe under timeout).
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From <linux/kvm.h>: the ioctls the probe needs (type 0xAE).
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46 // _IOW(0xAE, 0x46, struct kvm_userspace_memory_region), 32 bytes
	kvmRun                 = 0xAE80
	kvmGetRegs             = 0x8090AE81 // _IOR(0xAE, 0x81, struct kvm_regs), 144 bytes
	kvmSetRegs             = 0x4090AE82
	kvmGetSregs            = 0x8138AE83 // _IOR(0xAE, 0x83, struct kvm_sregs), 312 bytes
	kvmSetSregs            = 0x4138AE84

	kvmAPIVersion = 12
	kvmExitHLT    = 5

	guestAddr = 0x1000
	hlt       = 0xf4
)

type memoryRegion struct {
	slot, flags            uint32
	guestPhys, size, hostV uint64
}

func main() {
	if err := probe(); err != nil {
		fmt.Printf("tcg: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("kvm")
}

func ioctl(fd int, req uintptr, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

func probe() error {
	kvm, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	if v, err := ioctl(kvm, kvmGetAPIVersion, 0); err != nil || v != kvmAPIVersion {
		return fmt.Errorf("KVM API version %d (%v), want %d", v, err, kvmAPIVersion)
	}
	vmfd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	vm := int(vmfd)
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("guest memory: %w", err)
	}
	mem[0] = hlt
	region := memoryRegion{guestPhys: guestAddr, size: uint64(len(mem)), hostV: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if _, err := ioctl(vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return fmt.Errorf("KVM_SET_USER_MEMORY_REGION: %w", err)
	}
	cpufd, err := ioctl(vm, kvmCreateVCPU, 0)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VCPU: %w", err)
	}
	cpu := int(cpufd)
	size, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return fmt.Errorf("KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	run, err := unix.Mmap(cpu, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mapping the vCPU's run area: %w", err)
	}
	if err := realModeAt(cpu, guestAddr); err != nil {
		return err
	}
	if _, err := ioctl(cpu, kvmRun, 0); err != nil {
		return fmt.Errorf("KVM_RUN: %w", err)
	}
	// struct kvm_run: two u8 and six bytes of padding, then exit_reason.
	if reason := *(*uint32)(unsafe.Pointer(&run[8])); reason != kvmExitHLT {
		return fmt.Errorf("the vCPU stopped with exit reason %d, not on its HLT (%d)", reason, kvmExitHLT)
	}
	return nil
}

// realModeAt points the vCPU's code segment at 0 and its instruction
// pointer at addr.
func realModeAt(cpu int, addr uint64) error {
	var sregs [312]byte
	if _, err := ioctl(cpu, kvmGetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_GET_SREGS: %w", err)
	}
	// The first kvm_segment is cs: base (u64) at 0, selector (u16) at 12.
	*(*uint64)(unsafe.Pointer(&sregs[0])) = 0
	*(*uint16)(unsafe.Pointer(&sregs[12])) = 0
	if _, err := ioctl(cpu, kvmSetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_SREGS: %w", err)
	}
	var regs [18]uint64 // rax..r15, rip, rflags
	if _, err := ioctl(cpu, kvmGetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return fmt.Errorf("KVM_GET_REGS: %w", err)
	}
	regs[16], regs[17] = addr, 2 // rflags bit 1 is always set
	if _, err := ioctl(cpu, kvmSetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_REGS: %w", err)
	}
	return nil
}
