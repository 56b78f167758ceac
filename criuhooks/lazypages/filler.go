package lazypages

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Background fill sizes, as in CRIU's daemon: small right after a fault, so
// that the next fault waits little, growing while the task does not fault.
const (
	minChunk = 64 << 10
	maxChunk = 4 << 20
)

var (
	// errExited: the task's memory is gone (it exited or was killed).
	errExited = errors.New("task exited")
	// errRetry: the task's memory map is changing; read its events first.
	errRetry = errors.New("memory map changing")
)

// phase is where a sibling is, as its fillers see it.
type phase int32

const (
	// restoring: CRIU is still restoring. Areas are registered late in the
	// restorer, so only faults may be answered; a copy could find its area
	// not registered yet.
	restoring phase = iota
	// running: every area is registered and the tasks run; fill them.
	running
	// abandoned: the sibling failed or the daemon is closing; its tasks are
	// being killed, so stop.
	abandoned
)

// fillerHost is what a filler needs from the sibling it belongs to.
type fillerHost interface {
	phase() phase
	counters() *Counters
	// forked starts serving the userfaultfd of a child forked by a task of
	// the sibling, whose missing pages are those of its parent.
	forked(u *uffd, miss *pending, src pageSource)
}

// filler serves one userfaultfd: the memory of one restored task, or of a
// child it forked while it was still missing pages. Its goroutine is the
// only one that touches the userfaultfd and the missing set, and it reads
// the task's events before every copy that could race with them (the kernel
// fails such copies with EAGAIN until the event is read), so the set always
// matches the task's address space.
type filler struct {
	u    *uffd
	miss *pending
	src  pageSource
	buf  []byte // for a source that is read, not mapped
	host fillerHost
	// share, while set, is a share the task waits for (share.go): no
	// background copies until it is settled.
	share  *shareState
	cursor uint64
	chunk  uint64
	// faults are addresses a task waits on that could not be answered yet
	// because the task's memory map was changing.
	faults []uint64
	msgs   []uffdMsg
	// pause is a wait between background chunks (Options.ChunkPause).
	pause time.Duration
	// niced: the filler's thread runs at backgroundNice.
	niced bool
	// noNice: the thread's priority cannot be changed; leave it alone.
	noNice bool
	// slots, if set, bound the fillers that copy in the background at once.
	slots *fillSlots
	// ahead and aheadEnd are the last read-ahead after a fault: its size,
	// and where it ended.
	ahead, aheadEnd uint64
}

// backgroundNice is the nice value of a filler's thread while it copies
// pages no task waits for: the sibling's first command, and everything else
// on the machine, come first. Faults are answered at the caller's priority.
const backgroundNice = 10

func newFiller(u *uffd, miss *pending, src pageSource, host fillerHost) *filler {
	return &filler{u: u, miss: miss, src: src, host: host, chunk: minChunk}
}

// run serves the task until every missing page is filled (nil), the task is
// gone (errExited), the sibling is abandoned, or something fails that leaves
// the task's memory unknown.
func (f *filler) run() error {
	// A thread's priority is its own: this goroutine keeps its thread, and
	// gives it back at its old priority. If that cannot be restored, the
	// thread ends with the goroutine instead.
	runtime.LockOSThread()
	base, err := threadNice()
	if err != nil {
		f.noNice = true
	}
	defer func() {
		if f.setNice(false, base); !f.niced {
			runtime.UnlockOSThread()
		}
	}()
	defer f.slots.give(f.u)
	defer func() {
		// A Share still waiting for this task has nothing more to wait for.
		if f.share != nil {
			close(f.share.settled)
		}
	}()
	for {
		var err error
		if f.msgs, err = f.u.read(f.msgs[:0]); err != nil {
			return err
		}
		if len(f.msgs) > 0 || len(f.faults) > 0 {
			f.setNice(false, base)
		}
		if err := f.handleAll(f.msgs); err != nil {
			return err
		}
		if len(f.msgs) > 0 {
			continue
		}
		if err := f.retryFaults(); err != nil {
			return err
		}
		switch f.host.phase() {
		case abandoned:
			return errAbandoned
		case restoring:
			f.u.wait(0)
			continue
		}
		if f.share != nil {
			ok, err := f.awaitShare()
			if err != nil {
				return err
			}
			if !ok {
				f.u.wait(0)
				continue
			}
		}
		if f.miss.empty() && len(f.faults) == 0 {
			return nil
		}
		if !f.slots.take(f.u) {
			// Queued: faults are answered while it waits, and the
			// slot's hand-over ends the wait.
			f.u.wait(0)
			continue
		}
		f.setNice(true, base)
		switch err := f.background(); {
		case errors.Is(err, errRetry):
			f.u.wait(time.Millisecond)
		case err != nil:
			return err
		case f.pause > 0:
			f.u.wait(f.pause)
		}
	}
}

// setNice puts the filler's thread at backgroundNice (background) or back
// at base. A thread whose priority cannot be changed keeps it.
func (f *filler) setNice(background bool, base int) {
	if f.noNice || f.niced == background {
		return
	}
	nice := base
	if background {
		nice = max(base, backgroundNice)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, nice); err != nil {
		f.noNice = true
		return
	}
	f.niced = background
}

// threadNice is the calling thread's nice value. (On Linux, PRIO_PROCESS
// with who 0 is the calling thread, and the system call returns 20 - nice.)
func threadNice() (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, err
	}
	return 20 - prio, nil
}

func (f *filler) handleAll(msgs []uffdMsg) error {
	for _, m := range msgs {
		if err := f.handle(m); err != nil {
			return err
		}
	}
	return nil
}

func (f *filler) handle(m uffdMsg) error {
	switch m.event {
	case uffdEventPagefault:
		f.host.counters().Faults.Add(1)
		return f.fault(m.address &^ (pageSize - 1))
	case uffdEventFork:
		return f.fork(int(m.a))
	case uffdEventRemap:
		f.miss.move(m.a, m.b, m.c)
	case uffdEventRemove, uffdEventUnmap:
		// MADV_DONTNEED (and the like) or munmap: the task reads zeros
		// there from now on, or nothing. CRIU's daemon also unregisters
		// a removed range; that splits the task's VMA, so an mremap of
		// the whole area would then fail with EFAULT where the source's
		// succeeds. The range stays registered, and faults there get
		// the zero page.
		f.miss.remove(m.a, m.b)
	default:
		return fmt.Errorf("unexpected userfaultfd event %#x", m.event)
	}
	return nil
}

// fault answers a task waiting on the page at addr: with its data if the
// dump had it, with the zero page if not (memory the task never touched
// before the dump, or stack it grows into).
func (f *filler) fault(addr uint64) error {
	err := f.faultOnce(addr)
	if errors.Is(err, errRetry) {
		f.faults = append(f.faults, addr)
		return nil
	}
	return err
}

func (f *filler) faultOnce(addr uint64) error {
	if s, ok := f.miss.take(addr, pageSize); ok {
		// Fill on from here: a task that touches one page tends to touch
		// the next.
		f.cursor, f.chunk = s.end, minChunk
		if err := f.fill(s, &f.host.counters().FaultPages); err != nil {
			return err
		}
		return f.readAhead(addr)
	}
	err := f.u.zero(addr, pageSize)
	switch {
	case err == nil:
		f.host.counters().ZeroPages.Add(1)
		return nil
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOENT):
		// Already filled (the fault was queued before a copy woke the
		// task), or no longer mapped.
		return nil
	case errors.Is(err, unix.EAGAIN):
		return errRetry
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOSPC):
		return errExited
	}
	return fmt.Errorf("zero page at %#x: %w", addr, err)
}

// readAhead copies the pages after a fault at addr, once the task that
// faulted is awake. A task that faults where the last read-ahead ended reads
// its memory in order, so each read-ahead is twice the last, up to maxChunk:
// it waits once a chunk, not once a page, whether or not its filler has a
// slot to fill in the background. While CRIU restores (see restoring), or
// while a share is pending (share.go: an area with a page copied in is
// refused by the module), only the fault itself is answered.
func (f *filler) readAhead(addr uint64) error {
	if f.host.phase() != running || f.share != nil {
		return nil
	}
	n := uint64(minChunk)
	if addr == f.aheadEnd {
		n = min(2*f.ahead, maxChunk)
	}
	s, ok := f.miss.take(addr+pageSize, n)
	if !ok {
		f.aheadEnd = 0
		return nil
	}
	f.ahead, f.aheadEnd, f.cursor = n, s.end, s.end
	return f.fill(s, &f.host.counters().FaultPages)
}

func (f *filler) retryFaults() error {
	pending := f.faults
	f.faults = nil
	for _, addr := range pending {
		if err := f.fault(addr); err != nil {
			return err
		}
	}
	return nil
}

func (f *filler) background() error {
	s, ok := f.miss.next(f.cursor, f.chunk)
	if !ok {
		return nil
	}
	f.cursor = s.end
	f.chunk = min(f.chunk+minChunk, maxChunk)
	return f.fill(s, &f.host.counters().BackgroundPages)
}

// fill copies s into the task. What it cannot copy yet goes back into the
// missing set.
func (f *filler) fill(s span, pages counter) error {
	onePage := false
	for s.len() > 0 {
		n := s.len()
		if onePage {
			n = pageSize
		}
		data, err := f.src.at(&f.buf, n, s.src)
		if err != nil {
			f.miss.put(s)
			return fmt.Errorf("read %d bytes of memory for %#x: %w", n, s.start, err)
		}
		done, err := f.u.copy(s.start, data)
		pages.Add(done / pageSize)
		s = s.tail(done)
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN):
			f.miss.put(s)
			return errRetry
		case errors.Is(err, unix.EEXIST):
			// The page is there already; nothing the daemon did put it
			// there, so count it.
			f.host.counters().ExistingPages.Add(1)
			s = s.tail(pageSize)
		case errors.Is(err, unix.ENOENT) && n > pageSize:
			// s crosses a VMA boundary the task made after the dump
			// (mprotect splits VMAs without an event): go page by page.
			onePage = true
		case errors.Is(err, unix.ENOENT):
			// No registered VMA here and no event pending (a pending
			// event would have made this EAGAIN): the page is not
			// mapped any more, so the task can never read it.
			s = s.tail(pageSize)
		case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOSPC):
			return errExited
		default:
			f.miss.put(s)
			return fmt.Errorf("copy %d bytes to %#x: %w", n, s.start, err)
		}
	}
	return nil
}

func (f *filler) fork(fd int) error {
	u, err := newUffd(fd)
	if err != nil {
		return err
	}
	// The child's page tables were copied from the task's while copies
	// into the task were held off (EAGAIN until this event was read), so it
	// misses exactly what the task misses now.
	f.host.forked(u, f.miss.clone(), f.src)
	return nil
}
