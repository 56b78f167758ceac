package lazypages

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tclone/tclone/test/testenv"
	"golang.org/x/sys/unix"
)

// testHost is a sibling with nothing but a phase and counters.
type testHost struct {
	state atomic.Int32
	c     Counters
	forks atomic.Int32
}

func (h *testHost) phase() phase                             { return phase(h.state.Load()) }
func (h *testHost) counters() *Counters                      { return &h.c }
func (h *testHost) forked(u *uffd, _ *pending, _ pageSource) { h.forks.Add(1); u.Close() }

// region is memory of the test process registered with a userfaultfd of its
// own, so that the filler under test serves the test's own faults.
//
// The test must never fault on it from Go code: a goroutine waiting in a
// page fault cannot be stopped, and the Go runtime does stop every goroutine
// now and then (a garbage collection stops the world, and flushes each P's
// caches), whereupon the filler, the only one that could end the fault, is
// stopped too and the test binary hangs for good, deaf even to -timeout.
// The filler's own allocations start collections. So the test reads the
// region only through system calls (wantPage): the fault is then taken in
// the kernel, and the runtime does not wait for a goroutine in a system call.
// That needs a userfaultfd that takes kernel-mode faults, as CRIU's do; an
// unprivileged one (UFFD_USER_MODE_ONLY) would fail such a read.
type region struct {
	mem []byte
	u   *uffd
}

func newRegion(t *testing.T, pages int) *region {
	t.Helper()
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		testenv.Missing(t, "userfaultfd not available here: %v (faults in kernel mode take root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)", errno)
	}
	// CRIU's features but FORK, which takes CAP_SYS_PTRACE.
	api := struct{ api, features, ioctls uint64 }{api: uffdAPI, features: criuFeatures &^ uffdFeatureEventFork}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
		unix.Close(int(fd))
		testenv.Missing(t, "UFFDIO_API with remap/remove/unmap events: %v", errno)
	}
	mem, err := unix.Mmap(-1, 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	reg := struct {
		start, len, mode, ioctls uint64
	}{start: uint64(uintptr(unsafe.Pointer(&mem[0]))), len: uint64(len(mem)), mode: uffdRegisterModeMissing}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
		t.Fatalf("UFFDIO_REGISTER: %v", errno)
	}
	u, err := newUffd(int(fd))
	if err != nil {
		t.Fatal(err)
	}
	r := &region{mem: mem, u: u}
	t.Cleanup(func() { u.Close(); munmap(r.mem) })
	return r
}

// munmap unmaps any part of a mapping (unix.Munmap only takes whole
// mappings it made itself).
func munmap(b []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MUNMAP, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func (r *region) addr(page int) uint64 {
	return uint64(uintptr(unsafe.Pointer(&r.mem[0]))) + uint64(page*pageSize)
}

// source is a pages image: page i holds byte i+1 throughout.
func source(pages int) mappedPages {
	b := make([]byte, pages*pageSize)
	for i := range pages {
		for j := range pageSize {
			b[i*pageSize+j] = byte(i + 1)
		}
	}
	return b
}

func runFiller(t *testing.T, f *filler) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.run() }()
	return done
}

func waitFiller(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("filler: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("filler did not finish")
	}
}

// finish lets the sibling run, waits for the filler to fill everything,
// and closes the userfaultfd as the daemon does once a filler is done: from
// then on, pages the daemon did not fill read as zeros.
func finish(t *testing.T, h *testHost, r *region, done <-chan error) {
	t.Helper()
	h.state.Store(int32(running))
	r.u.interrupt()
	waitFiller(t, done)
	r.u.Close()
}

func wantPage(t *testing.T, mem []byte, page int, b byte) {
	t.Helper()
	got, err := readPage(mem[page*pageSize : (page+1)*pageSize])
	if err != nil {
		t.Fatalf("page %d: %v", page, err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{b}, pageSize)) {
		t.Fatalf("page %d starts %v, want all %d", page, got[:8], b)
	}
}

// answered waits until the filler has counted n pages answered to faults
// (copied or zero): it counts a page after the copy that wakes the faulting
// task, so the test, woken, may look first. Faults are handled one after
// another, so once a later fault's page is counted, everything an earlier
// one did is too.
func answered(t *testing.T, h *testHost, n uint64) {
	t.Helper()
	count := func() uint64 { return h.c.FaultPages.Load() + h.c.ZeroPages.Load() }
	for deadline := time.Now().Add(time.Minute); count() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the filler counted %d pages answered to faults, not %d", count(), n)
		}
	}
}

// readPage copies src, registered memory, by writing it to a pipe: the
// kernel reads it, so a fault there is taken in a system call (see region).
// It gives up after 20 s; the write then ends when the test's cleanup closes
// the userfaultfd.
func readPage(src []byte) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	deadline := time.Now().Add(20 * time.Second)
	go func() {
		b, err := pipeCopy(src, deadline)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-time.After(time.Until(deadline) + time.Second):
		return nil, errors.New("the fault on it was not answered in 20 s")
	}
}

func pipeCopy(src []byte, deadline time.Time) ([]byte, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	for off := 0; off < len(src); {
		n, err := unix.Write(p[1], src[off:])
		switch {
		case err == nil:
			off += n
		case (errors.Is(err, unix.EFAULT) || errors.Is(err, unix.EINTR)) && time.Now().Before(deadline):
			// A signal to the thread (the runtime's preemption, a
			// child's SIGCHLD) ends a fault in kernel mode with EFAULT
			// when nothing was copied yet: the page may still come.
		default:
			return nil, fmt.Errorf("write to a pipe: %w", err)
		}
	}
	b := make([]byte, len(src))
	for off := 0; off < len(b); {
		n, err := unix.Read(p[0], b[off:])
		if err != nil {
			return nil, fmt.Errorf("read from a pipe: %w", err)
		}
		off += n
	}
	return b, nil
}

// TestFillerServesFaultsThenFillsTheRest: while the sibling is restoring the
// filler answers faults only (with the dump's data, or the zero page where
// the dump had nothing); once it runs, it fills every missing page and
// returns.
func TestFillerServesFaultsThenFillsTheRest(t *testing.T) {
	r := newRegion(t, 64)
	src := source(48)
	// Pages 0-31 and 40-55 are in the dump; 32-39 and 56-63 are not.
	miss := newPending([]span{
		{r.addr(0), r.addr(32), 0},
		{r.addr(40), r.addr(56), 32 * pageSize},
	})
	h := &testHost{}
	f := newFiller(r.u, miss, src, h)
	done := runFiller(t, f)

	wantPage(t, r.mem, 5, 6)
	wantPage(t, r.mem, 33, 0)
	wantPage(t, r.mem, 41, 34)
	answered(t, h, 3)
	if h.c.BackgroundPages.Load() != 0 {
		t.Fatal("filled in the background before the restore finished")
	}
	if h.c.Faults.Load() != 3 || h.c.FaultPages.Load() != 2 || h.c.ZeroPages.Load() != 1 {
		t.Fatalf("after 3 faults: faults %d, fault pages %d, zero pages %d", h.c.Faults.Load(), h.c.FaultPages.Load(), h.c.ZeroPages.Load())
	}

	if registered, err := Registered(os.Getpid()); err != nil || !registered {
		t.Fatalf("Registered with a registered area = %v, %v", registered, err)
	}
	// This process holds the userfaultfd itself, as a program that uses
	// one does: it is not a task a daemon fills.
	if filling, err := Filling(os.Getpid()); err != nil || filling {
		t.Fatalf("Filling of a task holding its own userfaultfd = %v, %v", filling, err)
	}
	finish(t, h, r, done)
	if registered, err := Registered(os.Getpid()); err != nil || registered {
		t.Fatalf("Registered once the userfaultfd is closed = %v, %v", registered, err)
	}
	if got := h.c.FaultPages.Load() + h.c.BackgroundPages.Load(); got != 48 {
		t.Fatalf("copied %d pages, want the dump's 48", got)
	}
	for p := range 64 {
		want := byte(0)
		switch {
		case p < 32:
			want = byte(p + 1)
		case p >= 40 && p < 56:
			want = byte(p - 40 + 33)
		}
		wantPage(t, r.mem, p, want)
	}
}

// TestFillerFollowsRemoveRemapAndUnmap: the task throws some memory away,
// moves all of it and unmaps some while pages are still missing; the filler
// forgets, moves and drops them accordingly, and never fails. The discard
// must not change the task's VMAs: the mremap of the whole area after it
// succeeds as it would without lazy pages.
func TestFillerFollowsRemoveRemapAndUnmap(t *testing.T) {
	r := newRegion(t, 32)
	src := source(32)
	h := &testHost{}
	f := newFiller(r.u, newPending([]span{{r.addr(0), r.addr(32), 0}}), src, h)
	done := runFiller(t, f)

	wantPage(t, r.mem, 0, 1) // one page in place before the move
	if err := unix.Madvise(r.mem[4*pageSize:8*pageSize], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	dst, err := unix.Mmap(-1, 0, len(r.mem), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := unix.MremapPtr(unsafe.Pointer(&r.mem[0]), uintptr(len(r.mem)), unsafe.Pointer(&dst[0]), uintptr(len(dst)),
		unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED)
	if err != nil {
		t.Fatalf("mremap of the whole area after MADV_DONTNEED: %v", err)
	}
	r.mem = unsafe.Slice((*byte)(moved), len(dst))
	if err := munmap(r.mem[28*pageSize:]); err != nil {
		t.Fatal(err)
	}
	r.mem = r.mem[:28*pageSize]

	finish(t, h, r, done)
	for p := range 28 {
		want := byte(p + 1)
		if p >= 4 && p < 8 {
			want = 0 // discarded by MADV_DONTNEED
		}
		wantPage(t, r.mem, p, want)
	}
}

// nicedThreads counts the test process's threads at backgroundNice.
func nicedThreads(t *testing.T) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/self/task/*/stat")
	n := 0
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread just ended
		}
		// Fields after the command name: state is field 3, nice 19.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 16 && f[16] == strconv.Itoa(backgroundNice) {
			n++
		}
	}
	return n
}

func waitNiced(t *testing.T, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for nicedThreads(t) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d threads at nice %d, want %d", what, nicedThreads(t), backgroundNice, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFillerYieldsWhileFillingInTheBackground: the filler's thread answers
// faults at its caller's priority and copies in the background at
// backgroundNice, and no thread stays niced once the filler is done.
func TestFillerYieldsWhileFillingInTheBackground(t *testing.T) {
	const pages = 4096
	// The threads of earlier tests' fillers end just after they return.
	waitNiced(t, 0, "before the filler started")
	r := newRegion(t, pages)
	h := &testHost{}
	f := newFiller(r.u, newPending([]span{{r.addr(0), r.addr(pages), 0}}), source(pages), h)
	f.pause = 20 * time.Millisecond
	done := runFiller(t, f)

	wantPage(t, r.mem, 7, 8)
	if n := nicedThreads(t); n != 0 {
		t.Fatalf("%d threads niced while only faults were answered", n)
	}
	h.state.Store(int32(running))
	r.u.interrupt()
	waitNiced(t, 1, "filling in the background")
	wantPage(t, r.mem, pages-2, byte((pages-1)%256))
	waitFiller(t, done)
	r.u.Close()
	waitNiced(t, 0, "after the filler returned")
}

// TestFillerStopsWhenAbandoned: an abandoned sibling's filler returns at
// once, with pages still missing.
func TestFillerStopsWhenAbandoned(t *testing.T) {
	r := newRegion(t, 8)
	h := &testHost{}
	f := newFiller(r.u, newPending([]span{{r.addr(0), r.addr(8), 0}}), source(8), h)
	done := runFiller(t, f)
	h.state.Store(int32(abandoned))
	r.u.interrupt()
	select {
	case err := <-done:
		if err != errAbandoned {
			t.Fatalf("abandoned filler returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("abandoned filler kept running")
	}
}

func TestDecodeMsg(t *testing.T) {
	raw := make([]byte, uffdMsgSize)
	raw[0] = uffdEventRemap
	*(*uint64)(unsafe.Pointer(&raw[8])) = 0x1000
	*(*uint64)(unsafe.Pointer(&raw[16])) = 0x9000
	*(*uint64)(unsafe.Pointer(&raw[24])) = 0x3000
	if m := decodeMsg(raw); m.event != uffdEventRemap || m.a != 0x1000 || m.b != 0x9000 || m.c != 0x3000 {
		t.Fatalf("remap = %+v", m)
	}
	raw[0] = uffdEventPagefault
	*(*uint64)(unsafe.Pointer(&raw[16])) = 0x7f0000001234
	if m := decodeMsg(raw); m.address != 0x7f0000001234 {
		t.Fatalf("pagefault = %+v", m)
	}
	raw[0] = uffdEventFork
	*(*uint32)(unsafe.Pointer(&raw[8])) = 42
	if m := decodeMsg(raw); m.a != 42 {
		t.Fatalf("fork = %+v", m)
	}
}
