//go:build linux && amd64

// Package inject runs one system call inside a live process that tclone
// does not otherwise hold, from outside, with ptrace: one thread is seized
// and interrupted, runs the call at a syscall instruction of its own vDSO,
// and is put back exactly as it was (a call its stop interrupted is
// restarted) before it is let go. The process sees only a short delay of
// that thread, as after a signal it does not handle; its other threads run
// on. The kernel lets the thread go should this process die, though it
// would then resume at the vDSO with the call's registers: a thread is
// therefore only ever held for one short call, never across anything that
// waits on this process.
//
// tclone uses it for one thing: to reap the zombie a twin leaves
// (criuhooks.Twin), which only its parent, a process of the source, can.
package inject

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// Errors a caller may want to tell apart.
var (
	// ErrTraced: another tracer (a debugger) holds the thread.
	ErrTraced = errors.New("the process is traced by another process")
)

// Reap reaps child, an exited child of process parent that only a wait
// with __WALL sees (a twin's exit signal is 0), by having a thread of
// parent run wait4(child, NULL, __WALL|WNOHANG, NULL). Both are host pids;
// started is child's start time (procfs.Stat.StartTime), which tells it
// from a process that took its pid since. It returns nil once child is
// reaped, or is no zombie of parent's to reap any more (WNOHANG: a live
// process is never waited for).
func Reap(parent, child int, started uint64) error {
	inParent, err := pidIn(child, parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil // reaped already
	}
	if err != nil {
		return err
	}
	st, err := procfs.ReadStat(child)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.StartTime != started || st.PPid != parent {
		return nil // reaped already; the pid is another process's now
	}
	ret, err := Call(parent, unix.SYS_WAIT4, uint64(inParent), 0, unix.WALL|unix.WNOHANG, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("reaping %d in its parent %d: %w", child, parent, err)
	}
	switch {
	case ret == int64(inParent), ret == -int64(unix.ECHILD):
		return nil
	case ret == 0:
		return fmt.Errorf("reaping %d in its parent %d: it has not exited", child, parent)
	case ret < 0:
		return fmt.Errorf("reaping %d in its parent %d: wait4: %w", child, parent, unix.Errno(-ret))
	}
	return fmt.Errorf("reaping %d in its parent %d: wait4 returned %d", child, parent, ret)
}

// pidIn is the pid of child as process parent sees it: child's NSpid at
// the depth of parent's PID namespace.
func pidIn(child, parent int) (int, error) {
	cns, err := procfs.NSpid(child)
	if err != nil {
		return 0, err
	}
	pns, err := procfs.NSpid(parent)
	if err != nil {
		return 0, err
	}
	if len(cns) < len(pns) {
		return 0, fmt.Errorf("process %d is outside the PID namespace of %d", child, parent)
	}
	return cns[len(pns)-1], nil
}

// Call runs system call nr with args in a thread of process pid and
// returns what it returned (-errno on failure).
func Call(pid int, nr uint64, args ...uint64) (int64, error) {
	var a [6]uint64
	copy(a[:], args)
	type result struct {
		ret int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		// ptrace requests must all come from the thread that seized.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ret, err := call(pid, nr, a)
		done <- result{ret, err}
	}()
	r := <-done
	return r.ret, r.err
}

func call(pid int, nr uint64, args [6]uint64) (int64, error) {
	site, err := vdsoSyscall(pid)
	if err != nil {
		return 0, err
	}
	tid, err := seizeThread(pid)
	if err != nil {
		return 0, err
	}
	var saved unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &saved); err != nil {
		detach(tid)
		return 0, fmt.Errorf("reading the registers of thread %d: %w", tid, err)
	}
	if saved.Cs != 0x33 {
		detach(tid)
		return 0, fmt.Errorf("thread %d runs in 32-bit mode", tid)
	}
	mask, err := sigmask(tid, unix.PTRACE_GETSIGMASK, 0)
	if err == nil {
		_, err = sigmask(tid, unix.PTRACE_SETSIGMASK, ^uint64(0))
	}
	if err != nil {
		detach(tid)
		return 0, fmt.Errorf("blocking the signals of thread %d: %w", tid, err)
	}
	ret, cerr := run(tid, &saved, site, nr, args)
	restore := resumable(saved)
	err = errors.Join(cerr, unix.PtraceSetRegs(tid, &restore))
	if _, merr := sigmask(tid, unix.PTRACE_SETSIGMASK, mask); merr != nil {
		err = errors.Join(err, merr)
	}
	return ret, errors.Join(err, detach(tid))
}

// seizeThread seizes and interrupts a live thread of pid (the leader, or
// another where the leader has exited) and waits for its stop.
func seizeThread(pid int) (int, error) {
	tids := []int{pid}
	others, _ := procfs.Threads(pid)
	for _, t := range others {
		if t != pid {
			tids = append(tids, t)
		}
	}
	var lastErr error
	for _, tid := range tids {
		if err := ptrace(unix.PTRACE_SEIZE, tid, 0, unix.PTRACE_O_TRACESYSGOOD); err != nil {
			if errors.Is(err, unix.EPERM) {
				lastErr = fmt.Errorf("seizing thread %d of %d: %w (%w)", tid, pid, ErrTraced, err)
			} else {
				lastErr = fmt.Errorf("seizing thread %d of %d: %w", tid, pid, err)
			}
			continue
		}
		if err := interrupt(tid); err != nil {
			detach(tid)
			lastErr = err
			continue
		}
		return tid, nil
	}
	return 0, lastErr
}

// interrupt stops a seized thread and waits for the stop. A signal that
// reaches it first is let through (it would have been delivered anyway). A
// thread stopped for job control (SIGSTOP, SIGTSTP: a job suspended in a
// shell) reports its stop and is held from it like any other: the call
// runs, and when it is let go the kernel puts it back in the job-control
// stop without telling its parent anything new, so it stays stopped until
// a SIGCONT, as before.
func interrupt(tid int) error {
	if err := ptrace(unix.PTRACE_INTERRUPT, tid, 0, 0); err != nil {
		return fmt.Errorf("interrupting thread %d: %w", tid, err)
	}
	for {
		status, err := waitStop(tid)
		if err != nil {
			return err
		}
		if stopEvent(status) == unix.PTRACE_EVENT_STOP {
			// The interrupt's stop, or a job-control stop's report.
			return nil
		}
		// A signal-delivery stop: deliver it (a stop signal stops the
		// thread, which then reports that stop), and wait for the stop.
		if err := ptrace(unix.PTRACE_CONT, tid, 0, uintptr(status.StopSignal())); err != nil {
			return fmt.Errorf("letting a signal through to thread %d: %w", tid, err)
		}
	}
}

// run has the stopped thread run one call at site and returns its result.
func run(tid int, saved *unix.PtraceRegs, site uint64, nr uint64, args [6]uint64) (int64, error) {
	r := *saved
	r.Rip, r.Rax, r.Orig_rax = site, nr, ^uint64(0) // no restart of what it was in
	r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9 = args[0], args[1], args[2], args[3], args[4], args[5]
	r.Eflags &^= 0x100 | 0x400 // TF, DF
	if err := unix.PtraceSetRegs(tid, &r); err != nil {
		return 0, fmt.Errorf("setting the registers of thread %d: %w", tid, err)
	}
	for stops := 0; stops < 2; {
		if err := ptrace(unix.PTRACE_SYSCALL, tid, 0, 0); err != nil {
			return 0, fmt.Errorf("running a call in thread %d: %w", tid, err)
		}
		status, err := waitStop(tid)
		if err != nil {
			return 0, err
		}
		switch {
		case stopEvent(status) != 0:
			// An event, or a job-control stop reported again: on.
			continue
		case status.StopSignal() == unix.SIGTRAP|0x80:
			stops++
		default:
			return 0, fmt.Errorf("thread %d stopped with %v while it ran a call", tid, status.StopSignal())
		}
	}
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		return 0, fmt.Errorf("reading the registers of thread %d: %w", tid, err)
	}
	return int64(r.Rax), nil
}

// resumable is the registers the thread must go on with: a call its stop
// interrupted restarts, as the kernel restarts it on the way out of a
// signal stop (out of the syscall stop it now waits in, it would not).
func resumable(r unix.PtraceRegs) unix.PtraceRegs {
	if int64(r.Orig_rax) < 0 {
		return r
	}
	switch -int64(r.Rax) {
	case 512, 513, 514: // ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND
		r.Rax = r.Orig_rax
	case 516: // ERESTART_RESTARTBLOCK
		r.Rax = unix.SYS_RESTART_SYSCALL
	default:
		return r
	}
	r.Rip -= 2
	r.Orig_rax = ^uint64(0)
	return r
}

// stopEvent is the ptrace event of a stop, whatever its signal (a job-control
// stop reports PTRACE_EVENT_STOP with its stop signal, where WaitStatus's
// TrapCause only reads events of SIGTRAP stops).
func stopEvent(status unix.WaitStatus) int {
	return int(uint32(status) >> 16)
}

func waitStop(tid int) (unix.WaitStatus, error) {
	for {
		var status unix.WaitStatus
		w, err := unix.Wait4(tid, &status, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("waiting for thread %d: %w", tid, err)
		}
		if w != tid {
			continue
		}
		if !status.Stopped() {
			return 0, fmt.Errorf("thread %d ended (%v) while held", tid, status)
		}
		return status, nil
	}
}

func detach(tid int) error {
	if err := ptrace(unix.PTRACE_DETACH, tid, 0, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("letting thread %d go: %w", tid, err)
	}
	return nil
}

func sigmask(tid int, req int, set uint64) (uint64, error) {
	v := set
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), 8, uintptr(unsafe.Pointer(&v)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return v, nil
}

func ptrace(req int, tid int, addr, data uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), addr, data, 0, 0)
	if e != 0 {
		return syscall.Errno(e)
	}
	return nil
}

// vdsoSyscall finds a syscall instruction in pid's vDSO.
func vdsoSyscall(pid int) (uint64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	var start, end uint64
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.HasSuffix(line, "[vdso]") {
			continue
		}
		lo, hi, ok := strings.Cut(strings.Fields(line)[0], "-")
		if !ok {
			break
		}
		start, _ = strconv.ParseUint(lo, 16, 64)
		end, _ = strconv.ParseUint(hi, 16, 64)
	}
	if end <= start {
		return 0, fmt.Errorf("process %d has no vDSO to run a call at", pid)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return 0, err
	}
	defer mem.Close()
	buf := make([]byte, end-start)
	if _, err := mem.ReadAt(buf, int64(start)); err != nil {
		return 0, fmt.Errorf("reading the vDSO of %d: %w", pid, err)
	}
	for i := 0; i+1 < len(buf); i++ {
		if buf[i] == 0x0f && buf[i+1] == 0x05 {
			return start + uint64(i), nil
		}
	}
	return 0, fmt.Errorf("the vDSO of %d holds no syscall instruction", pid)
}
