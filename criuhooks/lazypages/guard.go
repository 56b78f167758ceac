package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// guard keeps the daemon's promise when the daemon cannot: a process that
// shares the daemon's descriptor table (clone(CLONE_FILES), no exec), so
// every userfaultfd the daemon holds, receives, or has in flight on its
// sockets is held by the guard at the same instant. When the daemon dies,
// even by SIGKILL, the table and the userfaultfds in it survive in the guard;
// tasks still missing pages fault into a userfaultfd nobody reads and wait,
// killably, instead of reading zeros. The guard sees the daemon's pidfd
// become readable, kills every task the daemon had armed it with, plus the
// senders of anything left unread on the daemon's sockets, waits until they
// are gone, and only then exits, dropping the last reference.
//
// The daemon arms a task before it reads the task's userfaultfd, and disarms
// it only when its sibling's memory is complete; it arms every connection
// and listener for as long as it has them. If the guard itself dies, the
// daemon starts a new one and arms it with the same descriptors.
type guard struct {
	mu      sync.Mutex
	proc    *guardProc
	owner   int              // pidfd of this process, watched by the guard
	armed   map[int32]uint32 // fd -> arm op, to re-arm a new guard
	closing bool
	// lost is called when the guard died and no new one could be started.
	lost func(error)
}

type guardProc struct {
	pid     int
	ctlRead int
	ctl     *os.File
	state   *guardState
	exited  chan struct{}
}

func startGuard(lost func(error)) (*guard, error) {
	owner, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: guard: pidfd of the daemon: %w (Linux 5.3 or newer is needed)", err)
	}
	g := &guard{owner: owner, armed: map[int32]uint32{}, lost: lost}
	if g.proc, err = spawnGuard(owner); err != nil {
		unix.Close(owner)
		return nil, err
	}
	go g.watch(g.proc)
	return g, nil
}

func spawnGuard(owner int) (*guardProc, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("lazy pages: guard: control pipe: %w", err)
	}
	st := newGuardState(p[0], owner)
	pid, err := cloneGuard(st)
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, fmt.Errorf("lazy pages: guard: clone: %w", err)
	}
	proc := &guardProc{pid: pid, ctlRead: p[0], ctl: os.NewFile(uintptr(p[1]), "lazy-pages guard"),
		state: st, exited: make(chan struct{})}
	go func() {
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		close(proc.exited)
	}()
	return proc, nil
}

// cloneGuard starts the guard: clone(2) with CLONE_FILES and no CLONE_VM, so
// the child has its own copy of memory but the daemon's very descriptor
// table. exec would unshare the table, so the child runs guardMain, code
// written for a process without the Go runtime.
func cloneGuard(st *guardState) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	all, old := ^uint64(0), uint64(0)
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&old)), 8, 0, 0)
	pid, _, errno := syscall.RawSyscall6(syscall.SYS_CLONE, syscall.CLONE_FILES|uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if pid == 0 {
		guardMain(st)
	}
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
	runtime.KeepAlive(st)
	if errno != 0 {
		return 0, errno
	}
	return int(pid), nil
}

// sigSetmask is SIG_SETMASK of rt_sigprocmask(2).
const sigSetmask = 2

// watch replaces the guard if it dies while the daemon runs.
func (g *guard) watch(p *guardProc) {
	<-p.exited
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing || g.proc != p {
		return
	}
	next, err := spawnGuard(g.owner)
	if err == nil {
		g.proc = next
		err = g.rearm()
	}
	p.ctl.Close()
	unix.Close(p.ctlRead)
	if err != nil {
		g.lost(fmt.Errorf("lazy pages: the guard process died and could not be replaced: %w", err))
		return
	}
	go g.watch(next)
}

func (g *guard) rearm() error {
	for fd, op := range g.armed {
		if err := g.send(op, fd); err != nil {
			return err
		}
	}
	return nil
}

func (g *guard) send(op uint32, fd int32) error {
	var rec [guardRecordSize]byte
	binary.NativeEndian.PutUint32(rec[:], op)
	binary.NativeEndian.PutUint32(rec[4:], uint32(fd))
	if _, err := g.proc.ctl.Write(rec[:]); err != nil {
		return fmt.Errorf("lazy pages: guard: %w", err)
	}
	return nil
}

// arm tells the guard about fd. It returns once the record is in the pipe:
// from then on, a death of the daemon is handled for fd.
func (g *guard) arm(op uint32, fd int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.armed) >= guardMaxFDs {
		return fmt.Errorf("lazy pages: guard: %d descriptors armed already", guardMaxFDs)
	}
	g.armed[int32(fd)] = op
	return g.send(op, int32(fd))
}

// disarm is arm undone; fd may be closed once it returns.
func (g *guard) disarm(op uint32, fd int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.armed, int32(fd))
	return g.send(op, int32(fd))
}

// close stops the guard. Whatever is still armed is not killed: the caller
// has dealt with it.
func (g *guard) close() error {
	g.mu.Lock()
	g.closing = true
	p := g.proc
	err := g.send(guardExit, 0)
	g.mu.Unlock()
	<-p.exited
	p.ctl.Close()
	unix.Close(p.ctlRead)
	unix.Close(g.owner)
	return err
}
