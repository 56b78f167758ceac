package main

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"unsafe"

	"github.com/tclone/tclone/kernel/cherrypick"
	"golang.org/x/sys/unix"
)

// Helper commands for the hardening tests: areas with unusual flags, pins,
// CLONE_VM siblings, and cherrypicks made by the helper itself (so that the
// caller is a process the suite can kill, or one in another namespace).

// Kept open for the helper's lifetime: closing them would undo what they set.
var helperKeep []int

func helperCommandMore(cmd string, args []string) (string, error) {
	switch cmd {
	case "fillsame": // fillsame ADDR LEN VALUE: every page holds VALUE in every word
		v, err := parseArgs(args, 3)
		if err != nil {
			return "", err
		}
		for off := uint64(0); off < v[1]; off += 8 {
			*(*uint64)(ptr(v[0] + off)) = v[2]
		}
		return "", nil
	case "uffd": // uffd ADDR LEN: register the range for missing-page faults
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return "", uffdRegister(v[0], v[1])
	case "shstk": // shstk ADDR LEN: map a shadow stack there
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		const sysMapShadowStack = 453
		got, _, errno := unix.Syscall(sysMapShadowStack, uintptr(v[0]), uintptr(v[1]), 0)
		if errno != 0 {
			return "", fmt.Errorf("map_shadow_stack: %w", errno)
		}
		if uint64(got) != v[0] {
			return "", fmt.Errorf("map_shadow_stack returned %#x, want %#x", got, v[0])
		}
		return "", nil
	case "pkey": // pkey ADDR LEN: a fresh protection key on the range
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return pkeyProtect(v[0], v[1])
	case "mlock": // mlock ADDR LEN FLAGS (mlock2)
		v, err := parseArgs(args, 3)
		if err != nil {
			return "", err
		}
		if _, _, errno := unix.Syscall(unix.SYS_MLOCK2, uintptr(v[0]), uintptr(v[1]), uintptr(v[2])); errno != 0 {
			return "", fmt.Errorf("mlock2: %w", errno)
		}
		return "", nil
	case "mremap": // mremap OLD LEN NEW: move the area, keeping its anon_vma
		v, err := parseArgs(args, 3)
		if err != nil {
			return "", err
		}
		got, _, errno := unix.Syscall6(unix.SYS_MREMAP, uintptr(v[0]), uintptr(v[1]), uintptr(v[1]),
			unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, uintptr(v[2]), 0)
		if errno != 0 || uint64(got) != v[2] {
			return "", fmt.Errorf("mremap %#x -> %#x: %#x, %v", v[0], v[2], got, errno)
		}
		return "", nil
	case "pin": // pin ADDR LEN: register as io_uring fixed buffers (FOLL_PIN)
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return "", ioUringPin(v[0], v[1])
	case "clonevm": // clonevm: a CLONE_VM sibling process that only pauses
		pid, err := cloneVMSibling()
		if err != nil {
			return "", err
		}
		return strconv.Itoa(pid), nil
	case "cherrypick": // cherrypick SRCPID DSTPID ADDR LEN: the helper calls
		v, err := parseArgs(args, 4)
		if err != nil {
			return "", err
		}
		return "", helperCherrypick(int(v[0]), int(v[1]), v[2], v[3])
	}
	return "", fmt.Errorf("unknown command %q", cmd)
}

func uffdRegister(addr, length uint64) error {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		return fmt.Errorf("userfaultfd: %w", errno)
	}
	api := [3]uint64{0xAA, 0, 0} // UFFD_API, features, ioctls
	const uffdioAPI = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api[0]))); errno != 0 {
		return fmt.Errorf("UFFDIO_API: %w", errno)
	}
	reg := [4]uint64{addr, length, 1, 0} // range, UFFDIO_REGISTER_MODE_MISSING, ioctls
	const uffdioRegister = 0xc020aa00    // _IOWR(0xAA, 0x00, struct uffdio_register)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg[0]))); errno != 0 {
		return fmt.Errorf("UFFDIO_REGISTER: %w", errno)
	}
	helperKeep = append(helperKeep, int(fd))
	return nil
}

func pkeyProtect(addr, length uint64) (string, error) {
	key, _, errno := unix.Syscall(unix.SYS_PKEY_ALLOC, 0, 0, 0)
	if errno != 0 {
		return "", fmt.Errorf("pkey_alloc: %w", errno)
	}
	if _, _, errno := unix.Syscall6(unix.SYS_PKEY_MPROTECT, uintptr(addr), uintptr(length),
		unix.PROT_READ|unix.PROT_WRITE, key, 0, 0); errno != 0 {
		return "", fmt.Errorf("pkey_mprotect: %w", errno)
	}
	return strconv.Itoa(int(key)), nil
}

// ioUringPin registers the range as one fixed buffer: the kernel pins every
// page (FOLL_PIN | FOLL_LONGTERM) for as long as the ring lives.
func ioUringPin(addr, length uint64) error {
	var params [120]byte // struct io_uring_params, all defaults
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return fmt.Errorf("io_uring_setup: %w", errno)
	}
	iov := unix.Iovec{Base: (*byte)(ptr(addr))}
	iov.SetLen(int(length))
	const ioringRegisterBuffers = 0
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, fd, ioringRegisterBuffers,
		uintptr(unsafe.Pointer(&iov)), 1, 0, 0); errno != 0 {
		unix.Close(int(fd))
		return fmt.Errorf("IORING_REGISTER_BUFFERS: %w", errno)
	}
	helperKeep = append(helperKeep, int(fd))
	return nil
}

// cloneVMSibling starts a process that shares this helper's memory (CLONE_VM
// without CLONE_THREAD) on a stack of its own, and only ever pauses.
func cloneVMSibling() (int, error) {
	const stackSize = 64 * 1024
	stack, err := unix.Mmap(-1, 0, stackSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, err
	}
	top := uintptr(unsafe.Pointer(&stack[stackSize-64]))
	// The child inherits this thread's signal mask; with every signal
	// blocked no Go handler ever runs in it (SIGSTOP, SIGCONT and SIGKILL
	// still act).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old); err != nil {
		return 0, fmt.Errorf("block signals: %w", err)
	}
	pid := cloneVMPause(unix.CLONE_VM|uintptr(unix.SIGCHLD), top)
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil); err != nil {
		return 0, fmt.Errorf("restore signal mask: %w", err)
	}
	if int64(pid) < 0 {
		return 0, fmt.Errorf("clone(CLONE_VM): %w", unix.Errno(-int64(pid)))
	}
	return int(pid), nil
}

// cloneVMPause is in clonevm_amd64.s: clone(flags, stack), and in the child
// an endless pause() that never touches the stack or the Go runtime.
func cloneVMPause(flags, stack uintptr) uintptr

func helperCherrypick(srcPid, dstPid int, addr, length uint64) error {
	dev, err := cherrypick.Open()
	if err != nil {
		return err
	}
	defer dev.Close()
	src, err := unix.PidfdOpen(srcPid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", srcPid, err)
	}
	defer unix.Close(src)
	dst, err := unix.PidfdOpen(dstPid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", dstPid, err)
	}
	defer unix.Close(dst)
	_, err = dev.Cherrypick(src, dst, addr, length)
	var op *cherrypick.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("errno %s", unix.ErrnoName(op.Errno))
	}
	return err
}
