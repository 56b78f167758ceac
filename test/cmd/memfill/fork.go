package main

import (
	"runtime"
	"syscall"
	"unsafe"

	"github.com/tclone/tclone/test/pattern"
)

// exitJob makes rawFork's child exit at once: fork(2)'s cost, measured.
var exitJob = &hashJob{}

// sigSetmask is SIG_SETMASK of rt_sigprocmask(2).
const sigSetmask = 2

// hashJob is everything the forked child needs, prepared by the parent: the
// child runs without the Go runtime and may not allocate.
type hashJob struct {
	base unsafe.Pointer
	n    uint64
	out  uintptr
	hex  [16]byte
}

// rawFork forks the calling process with clone(2) and no exec, as fork(2)
// does, and runs the hash in the child. The Go runtime cannot run in such a
// child (its other threads are not there), so the child only makes raw
// system calls from nosplit code, the way syscall.forkAndExecInChild does,
// with every signal blocked.
//
// With job nil, the child only waits, forever: an extra task of the tree,
// holding a copy of the memory.
func rawFork(job *hashJob) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	all, old := ^uint64(0), uint64(0)
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&old)), 8, 0, 0)
	pid, _, errno := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if pid == 0 {
		if job == nil {
			idleChild()
		}
		if job == exitJob {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
		hashChild(job)
	}
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(pid), nil
}

//go:nosplit
//go:norace
func hashChild(j *hashJob) {
	h := uint64(pattern.Seed)
	for i := uint64(0); i < j.n; i++ {
		h = pattern.Mix(h, *(*uint64)(unsafe.Add(j.base, i*8)))
	}
	const digits = "0123456789abcdef"
	for k := 15; k >= 0; k-- {
		j.hex[k] = digits[h&15]
		h >>= 4
	}
	syscall.RawSyscall(syscall.SYS_WRITE, j.out, uintptr(unsafe.Pointer(&j.hex[0])), 16)
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
}

//go:nosplit
//go:norace
func idleChild() {
	for {
		syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
	}
}
