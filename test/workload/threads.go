package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Everything in this file runs on goroutines locked to their OS thread
// (runtime.LockOSThread) and never unlocked, so each one is a distinct,
// long-lived kernel thread with its own tid and state (signal mask, a
// blocking syscall in progress) that a checkpoint has to capture.

// ThreadInfo is one counter thread.
type ThreadInfo struct {
	TID   int   `json:"tid"`
	Count int64 `json:"count"`
}

// counterThreads are OS threads that each bump their own counter every
// millisecond. The first one also blocks SIGUSR1.
type counterThreads struct {
	tids   []int
	counts []atomic.Int64
}

// sigblkThread is the index of the counter thread that blocks SIGUSR1.
const sigblkThread = 0

// startCounterThreads starts n threads and returns once all of them run.
func startCounterThreads(n int) (*counterThreads, error) {
	t := &counterThreads{tids: make([]int, n), counts: make([]atomic.Int64, n)}
	type started struct {
		i   int
		tid int
		err error
	}
	ready := make(chan started, n)
	for i := range n {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives for ever
			var err error
			if i == sigblkThread {
				err = blockSignalOnThisThread(unix.SIGUSR1)
			}
			ready <- started{i, unix.Gettid(), err}
			if err != nil {
				return
			}
			// nanosleep rather than time.Sleep: the thread itself sleeps
			// in the kernel, which a checkpoint has to interrupt and
			// the restore has to resume.
			ts := unix.NsecToTimespec(int64(time.Millisecond))
			for {
				unix.Nanosleep(&ts, nil) // EINTR only shortens one tick
				t.counts[i].Add(1)
			}
		}()
	}
	for range n {
		s := <-ready
		if s.err != nil {
			return nil, fmt.Errorf("counter thread %d: %w", s.i, s.err)
		}
		t.tids[s.i] = s.tid
	}
	return t, nil
}

// snapshot returns every thread's tid and current count.
func (t *counterThreads) snapshot() []ThreadInfo {
	out := make([]ThreadInfo, len(t.tids))
	for i := range out {
		out[i] = ThreadInfo{TID: t.tids[i], Count: t.counts[i].Load()}
	}
	return out
}

// sigset returns a set holding only sig.
func sigset(sig unix.Signal) unix.Sigset_t {
	var set unix.Sigset_t
	bit := uint(sig) - 1
	set.Val[bit/64] |= 1 << (bit % 64)
	return set
}

// blockSignalOnThisThread adds sig to the calling thread's signal mask. The
// Go runtime gives new threads its initial mask, not this one, so the block
// stays on this thread alone.
func blockSignalOnThisThread(sig unix.Signal) error {
	set := sigset(sig)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil); err != nil {
		return fmt.Errorf("block %v: %w", sig, err)
	}
	return nil
}

// readSigBlk returns the SigBlk field of a thread of this process.
func readSigBlk(tid int) (string, error) {
	path := fmt.Sprintf("/proc/self/task/%d/status", tid)
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return parseSigBlk(f, path)
}

// parseSigBlk extracts the SigBlk field (a hex mask) from a
// /proc/<pid>/task/<tid>/status file.
func parseSigBlk(status io.Reader, name string) (string, error) {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		value, ok := strings.CutPrefix(sc.Text(), "SigBlk:")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		if _, err := strconv.ParseUint(value, 16, 64); err != nil {
			return "", fmt.Errorf("%s: malformed SigBlk %q", name, value)
		}
		return value, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return "", fmt.Errorf("%s has no SigBlk line", name)
}

// maskHasSignal reports whether a hex mask as in /proc status files
// includes sig.
func maskHasSignal(mask string, sig unix.Signal) (bool, error) {
	v, err := strconv.ParseUint(mask, 16, 64)
	if err != nil {
		return false, fmt.Errorf("malformed signal mask %q", mask)
	}
	if sig < 1 || sig > 64 {
		return false, fmt.Errorf("signal %d is out of range", sig)
	}
	return v&(1<<(uint(sig)-1)) != 0, nil
}

// tickTimer is a periodic timerfd read by its own thread.
type tickTimer struct {
	fd      int
	ticks   atomic.Uint64
	tid     int
	failure atomic.Value // string: why the reader thread stopped
}

// timerInterval is the timerfd period.
const timerInterval = 10 * time.Millisecond

// startTimer creates and arms the timerfd and starts its reader thread.
func startTimer() (*tickTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	period := unix.NsecToTimespec(int64(timerInterval))
	spec := unix.ItimerSpec{Interval: period, Value: period}
	if err := unix.TimerfdSettime(fd, 0, &spec, nil); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("timerfd_settime: %w", err)
	}
	t := &tickTimer{fd: fd}
	tids := make(chan int)
	go t.readLoop(tids)
	t.tid = <-tids
	return t, nil
}

// readLoop blocks in read(2) on the timerfd (it is blocking, not
// registered with Go's poller) and adds up the expirations.
func (t *tickTimer) readLoop(tids chan<- int) {
	runtime.LockOSThread()
	tids <- unix.Gettid()
	var buf [8]byte
	for {
		n, err := unix.Read(t.fd, buf[:])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil || n != 8 {
			t.failure.Store(fmt.Sprintf("timerfd read returned %d bytes, error %v", n, err))
			return
		}
		t.ticks.Add(binary.NativeEndian.Uint64(buf[:]))
	}
}

// interval reads the timer's period back from the kernel.
func (t *tickTimer) interval() (time.Duration, error) {
	var spec unix.ItimerSpec
	if err := unix.TimerfdGettime(t.fd, &spec); err != nil {
		return 0, fmt.Errorf("timerfd_gettime: %w", err)
	}
	return time.Duration(spec.Interval.Nano()), nil
}

// eventLoop is an eventfd and a "ping" pipe registered in an epoll
// instance, with a thread blocked in epoll_wait. The eventfd counts what
// serve writes; the ping pipe lets a report check that epoll still
// delivers events without changing the eventfd total.
type eventLoop struct {
	efd, epfd     int
	pingR, pingW  int
	tid           int
	total         atomic.Uint64 // sum of the eventfd values the epoll thread read
	written       atomic.Uint64 // sum of the values serve wrote to the eventfd
	wakeups       atomic.Uint64 // epoll_wait returns with events
	pingsSent     atomic.Uint64
	pingsSeen     atomic.Uint64
	failure       atomic.Value // string: why the epoll thread stopped
	mu            sync.Mutex   // serializes writers, so waits are unambiguous
	eventsTimeout time.Duration
}

func startEventLoop() (*eventLoop, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	var ping [2]int
	if err := unix.Pipe2(ping[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("ping pipe: %w", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	for _, fd := range []int{efd, ping[0]} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return nil, fmt.Errorf("epoll_ctl add fd %d: %w", fd, err)
		}
	}
	e := &eventLoop{efd: efd, epfd: epfd, pingR: ping[0], pingW: ping[1], eventsTimeout: 2 * time.Second}
	tids := make(chan int)
	go e.waitLoop(tids)
	e.tid = <-tids
	return e, nil
}

// waitLoop is the epoll thread. The fds are non-blocking so that a
// spurious wakeup cannot leave the thread stuck in read.
func (e *eventLoop) waitLoop(tids chan<- int) {
	runtime.LockOSThread()
	tids <- unix.Gettid()
	events := make([]unix.EpollEvent, 4)
	var buf [64]byte
	for {
		n, err := unix.EpollWait(e.epfd, events, -1)
		if err == unix.EINTR {
			continue // also what a restore does to a thread in epoll_wait
		}
		if err != nil {
			e.failure.Store(fmt.Sprintf("epoll_wait: %v", err))
			return
		}
		if n > 0 {
			e.wakeups.Add(1)
		}
		for _, ev := range events[:n] {
			switch int(ev.Fd) {
			case e.efd:
				if k, err := unix.Read(e.efd, buf[:8]); err == nil && k == 8 {
					e.total.Add(binary.NativeEndian.Uint64(buf[:8]))
				}
			case e.pingR:
				if k, err := unix.Read(e.pingR, buf[:]); err == nil && k > 0 {
					e.pingsSeen.Add(uint64(k))
				}
			}
		}
	}
}

// add writes 1 to the eventfd n times and waits until the epoll thread has
// read all of it.
func (e *eventLoop) add(n int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	for i := range n {
		if _, err := unix.Write(e.efd, one[:]); err != nil {
			return fmt.Errorf("write %d of %d to the eventfd: %w", i+1, n, err)
		}
		e.written.Add(1)
	}
	if !waitUntil(e.eventsTimeout, func() bool { return e.total.Load() >= e.written.Load() }) {
		return fmt.Errorf("epoll thread read %d of the %d written to the eventfd within %v%s",
			e.total.Load(), e.written.Load(), e.eventsTimeout, e.failureSuffix())
	}
	return nil
}

// ping checks that the epoll thread still receives events.
func (e *eventLoop) ping() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := unix.Write(e.pingW, []byte{1}); err != nil {
		return fmt.Errorf("write to the ping pipe: %w", err)
	}
	want := e.pingsSent.Add(1)
	if !waitUntil(e.eventsTimeout, func() bool { return e.pingsSeen.Load() >= want }) {
		return fmt.Errorf("epoll thread did not see a ping within %v%s", e.eventsTimeout, e.failureSuffix())
	}
	return nil
}

func (e *eventLoop) failureSuffix() string {
	if f, ok := e.failure.Load().(string); ok {
		return " (" + f + ")"
	}
	return ""
}

// waitUntil polls cond every millisecond until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
