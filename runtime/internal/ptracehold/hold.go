// Package ptracehold keeps every task of a container still for a moment,
// without a freezer: each thread is seized with ptrace and interrupted. The
// kernel lets every one go when the holding thread ends, however it ends, so
// a holder killed with SIGKILL can never leave the container stopped, as a
// frozen cgroup would be (it outlives whoever froze it).
//
// A hold is what a files-only fork takes its snapshot under; CRIU holds a
// tree the same way for a whole fork.
package ptracehold

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// Hold is a set of stopped tasks. Release lets them go; so does the death
// of the process that holds them.
type Hold struct {
	release chan struct{}
	done    chan error
	// Tasks is how many threads were stopped.
	Tasks int
}

// stopped is a seized thread, and the signal it was stopped to deliver, to
// be delivered when it is let go (0 for none).
type stopped struct {
	tid int
	sig syscall.Signal
}

// Stop seizes and interrupts every thread of the processes procs lists,
// listing again until a pass finds no thread it has not seized (the threads
// and children made meanwhile by tasks not yet stopped), and waits until
// each is stopped. It fails, letting every task go, when a task is traced by
// another process (a debugger) or does not stop before ctx ends.
func Stop(ctx context.Context, procs func() ([]int, error)) (*Hold, error) {
	h := &Hold{release: make(chan struct{}), done: make(chan error, 1)}
	ready := make(chan error, 1)
	go h.run(ctx, procs, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return h, nil
}

// Release lets every task go, delivering the signals some were stopped
// with, and waits until it is done.
func (h *Hold) Release() error {
	close(h.release)
	return <-h.done
}

// run does everything on one locked thread: a tracee answers only to the
// thread that seized it. The thread ends with the goroutine (it is never
// unlocked), and any tracee left with it is let go by the kernel.
func (h *Hold) run(ctx context.Context, procs func() ([]int, error), ready chan<- error) {
	runtime.LockOSThread()
	var held []stopped
	seized, err := seizeAll(procs)
	if err == nil {
		held, err = waitStopped(ctx, seized)
	}
	if err != nil {
		// What stopped meanwhile can be let go; a task still on its way
		// to the stop is let go by the kernel when this thread ends.
		wctx, cancel := context.WithTimeout(context.Background(), time.Second)
		late, _ := waitStopped(wctx, pending(seized, held))
		cancel()
		letGo(append(held, late...))
		ready <- err
		return
	}
	h.Tasks = len(held)
	ready <- nil
	<-h.release
	h.done <- letGo(held)
}

// seizeAll seizes every thread of the listed processes, pass after pass,
// until a pass seizes nothing new.
func seizeAll(procs func() ([]int, error)) ([]int, error) {
	seen := map[int]bool{}
	var seized []int
	for {
		pids, err := procs()
		if err != nil {
			return seized, err
		}
		added := 0
		for _, pid := range pids {
			tids, _ := procfs.Threads(pid) // none once pid is gone
			for _, tid := range tids {
				if seen[tid] {
					continue
				}
				seen[tid] = true
				ok, err := seize(tid)
				if err != nil {
					return seized, err
				}
				if ok {
					seized = append(seized, tid)
					added++
				}
			}
		}
		if added == 0 {
			return seized, nil
		}
	}
}

// seize seizes and interrupts one thread. A thread that is gone, or dead
// and not yet reaped, needs no holding (false, nil).
func seize(tid int) (bool, error) {
	err := unix.PtraceSeize(tid)
	switch {
	case errors.Is(err, unix.ESRCH):
		return false, nil
	case errors.Is(err, unix.EPERM):
		if st, serr := procfs.ReadStat(tid); serr != nil || st.Exited() {
			return false, nil
		}
		if tracer := tracerOf(tid); tracer != 0 {
			return false, fmt.Errorf("task %d is traced by process %d (a debugger or strace?): detach it first", tid, tgidOf(tracer))
		}
		return false, fmt.Errorf("seizing task %d: %w", tid, err)
	case err != nil:
		return false, fmt.Errorf("seizing task %d: %w", tid, err)
	}
	if err := unix.PtraceInterrupt(tid); err != nil && !errors.Is(err, unix.ESRCH) {
		return true, fmt.Errorf("interrupting task %d: %w", tid, err)
	}
	return true, nil
}

// tgidOf is the process a thread belongs to (the thread itself if that
// cannot be read).
func tgidOf(tid int) int {
	st, err := procfs.ReadStatus(tid)
	if err != nil || st.Tgid == 0 {
		return tid
	}
	return st.Tgid
}

// tracerOf is the TracerPid of /proc/TID/status, 0 when none.
func tracerOf(tid int) int {
	st, err := procfs.ReadStatus(tid)
	if err != nil {
		return 0
	}
	return st.TracerPid
}

// waitStopped waits until every seized thread is stopped, remembering the
// signal of one stopped to deliver it (it is delivered when let go).
func waitStopped(ctx context.Context, seized []int) ([]stopped, error) {
	var held []stopped
	for _, tid := range seized {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(tid, &ws, unix.WALL|unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ECHILD) {
				break // gone
			}
			if err != nil {
				return held, fmt.Errorf("waiting for task %d to stop: %w", tid, err)
			}
			if pid == tid {
				if ws.Stopped() {
					held = append(held, stopped{tid: tid, sig: deliverable(ws)})
				}
				break // stopped, or exited
			}
			if ctx.Err() != nil {
				return held, fmt.Errorf("task %d did not stop: %w", tid, ctx.Err())
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	return held, nil
}

// deliverable is the signal a stop was for, if the tracee still has to get
// it: a signal-delivery stop. The stops an interrupt or a group stop make
// carry PTRACE_EVENT_STOP and deliver nothing.
func deliverable(ws unix.WaitStatus) syscall.Signal {
	if ws.TrapCause() == unix.PTRACE_EVENT_STOP || ws.StopSignal() == unix.SIGTRAP {
		return 0
	}
	return ws.StopSignal()
}

// pending is what was seized but not seen stopped.
func pending(seized []int, held []stopped) []int {
	in := map[int]bool{}
	for _, s := range held {
		in[s.tid] = true
	}
	var out []int
	for _, tid := range seized {
		if !in[tid] {
			out = append(out, tid)
		}
	}
	return out
}

// letGo detaches every task. A task that is gone is not an error.
func letGo(tasks []stopped) error {
	var errs []error
	for _, t := range tasks {
		_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(t.tid), 0, uintptr(t.sig), 0, 0)
		if errno != 0 && errno != unix.ESRCH {
			errs = append(errs, fmt.Errorf("letting task %d go: %w", t.tid, errno))
		}
	}
	return errors.Join(errs...)
}
