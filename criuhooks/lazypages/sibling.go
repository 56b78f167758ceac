package lazypages

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/kernel/cherrypick"
)

// errAbandoned: the sibling failed or the daemon is closing.
var errAbandoned = errors.New("sibling abandoned")

type counter = *atomic.Uint64

// Counters count a sibling's memory work, in pages unless named otherwise.
type Counters struct {
	Faults          atomic.Uint64 // page faults the tasks waited on
	FaultPages      atomic.Uint64 // copied to answer a fault
	BackgroundPages atomic.Uint64 // copied ahead of any fault
	ZeroPages       atomic.Uint64 // zero pages mapped where the dump had none
	ExistingPages   atomic.Uint64 // found present where the daemon expected a hole
	SharedPages     atomic.Uint64 // lazy pages shared from a snapshot, not copied
}

// Stats is a sibling's progress, as reported with its events.
type Stats struct {
	Tasks     int       `json:"tasks"`
	LazyBytes uint64    `json:"lazy_bytes"` // what the daemon had to provide
	Connected time.Time `json:"connected"`  // CRIU connected
	Running   time.Time `json:"running"`    // CRIU finished; the tasks run
	Done      time.Time `json:"done"`       // complete or failed

	Faults          uint64 `json:"faults"`
	FaultPages      uint64 `json:"fault_pages"`
	BackgroundPages uint64 `json:"background_pages"`
	ZeroPages       uint64 `json:"zero_pages"`
	ExistingPages   uint64 `json:"existing_pages"`
	SharedPages     uint64 `json:"shared_pages"`
}

// task is one restored task of a sibling.
type task struct {
	imagePid int32
	host     int // host pid
	pidfd    int
}

// sibling is one restored tree: everything one `criu restore --lazy-pages`
// sent over one connection, and the children its tasks fork while filling.
type sibling struct {
	id     int
	socket string
	d      *Daemon
	state  atomic.Int32
	count  Counters

	mu       sync.Mutex
	stats    Stats
	tasks    []task
	uffds    map[*uffd]bool // open; true once its filler has returned
	active   int            // fillers running
	finished bool           // CRIU sent restore-finished
	failure  error
	killed   bool // its tasks are dead: closing their userfaultfds is safe
	reported bool
	// restore is a pidfd of the CRIU that restores the sibling (the peer
	// of its connection), or -1: it is killed with the tasks (killRestore).
	restore int
	// shares are its tasks' pending shares (share.go); shareExpired
	// closes ShareWait after restore-finished.
	shares       []*shareState
	shareExpired chan struct{}
	// copying: it was accepted by ListenCopying, and shares nothing.
	copying bool
}

func (s *sibling) phase() phase        { return phase(s.state.Load()) }
func (s *sibling) counters() *Counters { return &s.count }

// addTask serves a task whose header arrived. It arms the guard with the
// task before it reads the task's userfaultfd, so that there is no instant
// at which the daemon could die holding a userfaultfd the guard cannot
// account for. It reads the userfaultfd even when the task cannot be served,
// to keep the stream in step and the descriptor open until the sibling's
// tasks are dead; only an error reading it (errStream) ends the connection.
func (s *sibling) addTask(cc *criuConn, msg criuMsg) error {
	armErr := s.arm(msg)
	fd, err := cc.uffd()
	if err != nil {
		return fmt.Errorf("%w: %w", errStream, err)
	}
	u, err := newUffd(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	if armErr != nil {
		s.track(u)
		return armErr
	}
	img, src, err := s.d.images.task(msg.pid)
	if err != nil {
		s.track(u)
		return err
	}
	s.d.emit(Event{Kind: EventTask, Sibling: s.id, Socket: s.socket, Pid: msg.sender, ImagePid: msg.pid})
	s.mu.Lock()
	s.stats.LazyBytes += img.bytes
	s.mu.Unlock()
	s.serveTask(u, newPending(img.lazy), src, s.shareFor(msg, img, src))
	return nil
}

// shareFor is a task's pending share, or nil when its pages are copied.
func (s *sibling) shareFor(msg criuMsg, img *taskImage, src pageSource) *shareState {
	snap, ok := src.(snapshotPages)
	if d, isDrain := src.(drainSource); isDrain {
		snap, ok = d.snapshotPages, true
	}
	if s.d.dev == nil || s.copying || !ok || snap.f == nil || len(img.areas) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pidfd := -1
	for _, t := range s.tasks {
		if t.host == msg.sender {
			pidfd = t.pidfd
		}
	}
	if pidfd < 0 {
		return nil
	}
	st := &shareState{dev: s.d.dev, snap: cherrypick.SnapshotFile(snap.f), pidfd: pidfd, areas: img.areas, pause: s.d.opts.SharePause,
		req: make(chan chan shareResult, 1), settled: make(chan struct{}), expired: s.shareExpired}
	s.shares = append(s.shares, st)
	return st
}

// errStream: the restore's messages cannot be read on.
var errStream = errors.New("lazy pages: broken restore connection")

// arm records a task and arms the guard with it.
func (s *sibling) arm(msg criuMsg) error {
	if msg.sender <= 0 {
		return fmt.Errorf("lazy pages: task %d sent its userfaultfd without credentials", msg.pid)
	}
	pidfd, err := unix.PidfdOpen(msg.sender, 0)
	if err != nil {
		return fmt.Errorf("lazy pages: pidfd of restored task %d (pid %d): %w", msg.pid, msg.sender, err)
	}
	if err := s.d.guard.arm(guardArmTask, pidfd); err != nil {
		unix.Close(pidfd)
		return err
	}
	t := task{imagePid: msg.pid, host: msg.sender, pidfd: pidfd}
	s.mu.Lock()
	s.tasks = append(s.tasks, t)
	s.stats.Tasks++
	s.mu.Unlock()
	if s.phase() == abandoned {
		// The sibling failed while CRIU was still restoring it: this task
		// dies with the others, before its userfaultfd is even read.
		killAndWait([]task{t}, -1)
	}
	return nil
}

// track keeps u open until the sibling is done with it.
func (s *sibling) track(u *uffd) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uffds[u] = true
}

func (s *sibling) serve(u *uffd, miss *pending, src pageSource) { s.serveTask(u, miss, src, nil) }

func (s *sibling) serveTask(u *uffd, miss *pending, src pageSource, share *shareState) {
	s.mu.Lock()
	s.uffds[u] = false
	s.active++
	s.mu.Unlock()
	f := newFiller(u, miss, src, s)
	f.share = share
	f.pause = s.d.opts.ChunkPause
	f.slots = s.d.slots
	// A twin stays while a filler reads it (drain.go).
	held, _ := src.(heldSource)
	if held != nil {
		held.hold()
	}
	go func() {
		err := f.run()
		if held != nil {
			held.drop()
		}
		s.fillerDone(u, err)
	}()
}

func (s *sibling) forked(u *uffd, miss *pending, src pageSource) { s.serve(u, miss, src) }

func (s *sibling) fillerDone(u *uffd, err error) {
	if err != nil && !errors.Is(err, errExited) && !errors.Is(err, errAbandoned) {
		s.fail(fmt.Errorf("lazy pages: serving sibling %d: %w", s.id, err))
	}
	s.mu.Lock()
	s.active--
	// A filler that completed, or whose task is gone, leaves nothing a
	// task could read wrong when its userfaultfd closes. One that stopped
	// short keeps it open until the sibling's tasks are dead.
	if err == nil || errors.Is(err, errExited) || s.killed {
		delete(s.uffds, u)
		u.Close()
	} else {
		s.uffds[u] = true
	}
	s.mu.Unlock()
	s.maybeDone()
}

// restored is CRIU's restore-finished: every area is registered, the
// tasks are about to run.
func (s *sibling) restored() {
	s.mu.Lock()
	s.finished = true
	s.stats.Running = time.Now()
	s.mu.Unlock()
	if s.state.CompareAndSwap(int32(restoring), int32(running)) {
		if s.d.dev != nil {
			time.AfterFunc(s.d.opts.ShareWait, func() {
				close(s.shareExpired)
				s.interrupt()
			})
		}
		s.interrupt()
		s.d.emit(Event{Kind: EventRunning, Sibling: s.id, Socket: s.socket})
	}
	s.maybeDone()
}

func (s *sibling) interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for u := range s.uffds {
		u.interrupt()
	}
}

// fail gives up on the sibling: its memory cannot be completed, so its tasks
// are killed before any of their userfaultfds is closed.
func (s *sibling) fail(err error) {
	s.mu.Lock()
	if s.failure == nil {
		s.failure = err
	}
	s.mu.Unlock()
	if phase(s.state.Swap(int32(abandoned))) == abandoned {
		return
	}
	s.interrupt()
	s.mu.Lock()
	tasks := append([]task(nil), s.tasks...)
	restore := s.restore
	s.mu.Unlock()
	go func() {
		killAndWait(tasks, restore)
		s.mu.Lock()
		s.killed = true
		for u, stopped := range s.uffds {
			if stopped {
				delete(s.uffds, u)
				u.Close()
			}
		}
		s.mu.Unlock()
		s.maybeDone()
	}()
}

// connectionLost is an end of the restore's connection before
// restore-finished: CRIU failed and kills the tasks itself, but the daemon
// makes sure.
func (s *sibling) connectionLost(err error) {
	s.mu.Lock()
	finished := s.finished
	s.mu.Unlock()
	if !finished {
		s.fail(fmt.Errorf("lazy pages: restore of sibling %d ended before it finished: %w", s.id, err))
	}
}

// maybeDone reports the sibling once nothing of it is left running: its
// memory complete, or its tasks dead.
func (s *sibling) maybeDone() {
	s.mu.Lock()
	failure := s.failure
	done := s.active == 0 && !s.reported &&
		((failure == nil && s.finished) || (failure != nil && s.killed && len(s.uffds) == 0))
	if !done {
		s.mu.Unlock()
		return
	}
	s.reported = true
	s.stats.Done = time.Now()
	stats := s.snapshotLocked()
	tasks := s.tasks
	s.tasks = nil
	restore := s.restore
	s.restore = -1
	s.mu.Unlock()

	for _, t := range tasks {
		s.d.guard.disarm(guardDisarmTask, t.pidfd)
		unix.Close(t.pidfd)
	}
	s.releaseRestore(restore)
	ev := Event{Kind: EventComplete, Sibling: s.id, Socket: s.socket, Stats: &stats}
	if failure != nil {
		ev.Kind, ev.Err = EventFailed, failure
	}
	s.d.siblingDone(s, ev)
}

func (s *sibling) snapshotLocked() Stats {
	st := s.stats
	st.Faults = s.count.Faults.Load()
	st.FaultPages = s.count.FaultPages.Load()
	st.BackgroundPages = s.count.BackgroundPages.Load()
	st.ZeroPages = s.count.ZeroPages.Load()
	st.ExistingPages = s.count.ExistingPages.Load()
	return st
}

// killAndWait kills tasks and returns once they are gone (or after 10 s: a
// task that does not die of SIGKILL is stuck in the kernel and cannot run
// anything meanwhile either), and the CRIU behind restore (a pidfd, or -1)
// has ended: if it has not after restoreGrace, it is killed (killRestore).
func killAndWait(tasks []task, restore int) {
	var polls []unix.PollFd
	for _, t := range tasks {
		unix.PidfdSendSignal(t.pidfd, unix.SIGKILL, nil, 0)
		polls = append(polls, unix.PollFd{Fd: int32(t.pidfd), Events: unix.POLLIN})
	}
	if restore >= 0 {
		polls = append(polls, unix.PollFd{Fd: int32(restore), Events: unix.POLLIN})
	}
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	killed := false
	for len(polls) > 0 && time.Now().Before(deadline) {
		if restore >= 0 && !killed && time.Since(start) >= restoreGrace {
			killRestore(restore)
			killed = true
		}
		if _, err := unix.Poll(polls, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		alive := polls[:0]
		for _, p := range polls {
			if p.Revents == 0 {
				alive = append(alive, p)
			}
		}
		polls = alive
	}
}

// restoreGrace is how long the CRIU restoring killed tasks gets to end
// before it is killed too.
const restoreGrace = 2 * time.Second

// killRestore kills the CRIU that restores a sibling whose tasks were
// killed, once it has had restoreGrace to end. CRIU fails that restore, but
// may never return: when the tasks die after CRIU has seized them (its last
// restore stages), its failure path can wait for ever. Seen: waitpid of the
// root, a PID namespace's init with threads, whose last thread waits in the
// kernel for the other threads, zombies until their tracer, CRIU, reaps
// them; and a futex wait for tasks that will never report, after a seize
// found a task gone. Killing CRIU detaches its tracees and ends either.
// Earlier in a restore CRIU's own failure path kills the tasks this daemon
// never heard of, within the grace, so it is not cut short. It is killed
// only after the tasks have their SIGKILL, which they take before they
// could run again once detached.
func killRestore(pidfd int) {
	if pidfd >= 0 {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	}
}

// soPeerPidfd is SO_PEERPIDFD (Linux 6.5): a pidfd of a unix socket's peer.
const soPeerPidfd = 77

// peerPidfd returns a pidfd of the process that connected the unix socket
// fd: the CRIU of a restore. Kernels before 6.5 get one from the peer's
// credentials, which is as good while the peer still holds the connection.
func peerPidfd(fd int) (int, error) {
	if pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPeerPidfd); err == nil {
		return pidfd, nil
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return -1, fmt.Errorf("lazy pages: credentials of a restore's connection: %w", err)
	}
	pidfd, err := unix.PidfdOpen(int(cred.Pid), 0)
	if err != nil {
		return -1, fmt.Errorf("lazy pages: pidfd of the CRIU restoring (pid %d): %w", cred.Pid, err)
	}
	return pidfd, nil
}

// watchRestore arms the guard with the CRIU behind the sibling's
// connection, so that it is killed with the sibling's tasks when the daemon
// dies too.
func (s *sibling) watchRestore(connFD int) error {
	pidfd, err := peerPidfd(connFD)
	if err != nil {
		return err
	}
	if err := s.d.guard.arm(guardArmRestore, pidfd); err != nil {
		unix.Close(pidfd)
		return err
	}
	s.mu.Lock()
	s.restore = pidfd
	s.mu.Unlock()
	return nil
}

// releaseRestore disarms and closes the sibling's CRIU pidfd once the
// sibling is reported.
func (s *sibling) releaseRestore(pidfd int) {
	if pidfd < 0 {
		return
	}
	s.d.guard.disarm(guardDisarmRestore, pidfd)
	unix.Close(pidfd)
}
