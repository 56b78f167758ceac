package main

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Go runtime cannot fork(), but the tests need a real fork of a process
// whose memory came from a cherrypick, and the benchmark needs fork()'s cost.
// rawFork calls clone(SIGCHLD) directly; the child runs only the nosplit
// function it is given, which makes raw system calls and never returns into
// the runtime (no allocation, no stack growth, no scheduler).

// sumWords is the checksum the suite uses everywhere: over 8-byte words.
//
//go:nosplit
func sumWords(base unsafe.Pointer, n uintptr) uint64 {
	var sum uint64 = 14695981039346656037
	for off := uintptr(0); off+8 <= n; off += 8 {
		sum = (sum ^ *(*uint64)(unsafe.Add(base, off))) * 1099511628211
	}
	return sum
}

// childSumAndWrite reports the checksum of the region to wfd, then writes
// the region's first word (a CoW fault in the child) and exits.
//
//go:nosplit
func childSumAndWrite(base unsafe.Pointer, n uintptr, wfd int) {
	sum := sumWords(base, n)
	unix.RawSyscall(unix.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&sum)), 8)
	*(*uint64)(base) = ^*(*uint64)(base)
	unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
}

//go:nosplit
func childExit(base unsafe.Pointer, n uintptr, wfd int) {
	unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
}

// rawFork forks, runs child in the child, and returns the child's pid and
// how long clone() took in the parent (the page-table copy).
func rawFork(child func(unsafe.Pointer, uintptr, int), base unsafe.Pointer, n uintptr, wfd int) (int, time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// No Go signal handler may run in the child: block everything.
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old); err != nil {
		return 0, 0, fmt.Errorf("block signals: %w", err)
	}
	start := time.Now()
	pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if pid == 0 && errno == 0 {
		child(base, n, wfd)
	}
	took := time.Since(start)
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil); err != nil {
		return 0, 0, fmt.Errorf("restore signal mask: %w", err)
	}
	if errno != 0 {
		return 0, 0, fmt.Errorf("clone: %w", errno)
	}
	return int(pid), took, nil
}

func waitExit(pid int) error {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait4 %d: %w", pid, err)
		}
		if ws.Exited() || ws.Signaled() {
			if ws.Signaled() || ws.ExitStatus() != 0 {
				return fmt.Errorf("process %d ended with %v", pid, ws)
			}
			return nil
		}
	}
}
