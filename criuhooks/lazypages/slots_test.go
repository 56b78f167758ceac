package lazypages

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipeUffd stands in for a userfaultfd where only waits and interrupts
// matter: the read end of a pipe nothing is written to.
func pipeUffd(t *testing.T) *uffd {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	u, err := newUffd(p[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close(); unix.Close(p[1]) })
	return u
}

// waitEnds reports whether a wait on u ends within d.
func waitEnds(u *uffd, d time.Duration) bool {
	done := make(chan struct{})
	go func() { u.wait(0); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		u.interrupt()
		<-done
		return false
	}
}

// TestFillSlotsHandOverInOrder: with one slot, the second and third fillers
// queue; one that gives up its place leaves the queue; a slot given back
// goes to the first filler still queued, whose wait it ends.
func TestFillSlotsHandOverInOrder(t *testing.T) {
	a, b, c := pipeUffd(t), pipeUffd(t), pipeUffd(t)
	s := newFillSlots(1)
	if !s.take(a) {
		t.Fatal("the first filler got no slot")
	}
	if !s.take(a) {
		t.Fatal("the first filler lost its slot when it asked again")
	}
	if s.take(b) || s.take(c) || s.take(b) {
		t.Fatal("a second filler got the only slot")
	}
	if waitEnds(b, 50*time.Millisecond) {
		t.Fatal("a queued filler's wait ended before any slot was free")
	}
	s.give(c) // c leaves the queue
	s.give(a)
	if !waitEnds(b, 5*time.Second) {
		t.Fatal("the slot given back did not end the next filler's wait")
	}
	if !s.take(b) {
		t.Fatal("the slot given back went to another filler than the first queued")
	}
	if s.take(c) {
		t.Fatal("a filler that left the queue got a slot that was not free")
	}
	s.give(b)
	if !s.take(c) {
		t.Fatal("the filler queued again did not get the slot given back")
	}
	s.give(c)
	s.give(c) // a filler that holds nothing gives nothing
	if len(s.holders) != 0 || len(s.queue) != 0 || s.peak != 1 {
		t.Fatalf("after every filler gave back: %d holders, %d queued, peak %d", len(s.holders), len(s.queue), s.peak)
	}
	var unbounded *fillSlots
	if !unbounded.take(a) {
		t.Fatal("no fillSlots refused a slot")
	}
	unbounded.give(a)
}

// TestFillersTakeTurnsToFillInTheBackground: two tasks, one slot. While the
// first task fills in the background, the second copies nothing ahead of
// its faults but still answers them at once; it fills once the first is
// complete, and both end with every page right.
func TestFillersTakeTurnsToFillInTheBackground(t *testing.T) {
	const pages = 1024
	slots := newFillSlots(1)
	ra, rb := newRegion(t, pages), newRegion(t, pages)
	ha, hb := &testHost{}, &testHost{}
	ha.state.Store(int32(running))
	hb.state.Store(int32(running))
	fa := newFiller(ra.u, newPending([]span{{ra.addr(0), ra.addr(pages), 0}}), source(pages), ha)
	fb := newFiller(rb.u, newPending([]span{{rb.addr(0), rb.addr(pages), 0}}), source(pages), hb)
	fa.slots, fb.slots = slots, slots
	// About a dozen chunks 20 ms apart: the first task fills for ~0.2 s.
	fa.pause, fb.pause = 20*time.Millisecond, 20*time.Millisecond
	doneA := runFiller(t, fa)
	deadline := time.Now().Add(10 * time.Second)
	for ha.c.BackgroundPages.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first filler never filled in the background")
		}
		time.Sleep(time.Millisecond)
	}
	doneB := runFiller(t, fb)
	wantPage(t, rb.mem, 5, 6)

	var errA error
	for finished := false; !finished; {
		select {
		case errA = <-doneA:
			finished = true
		case <-time.After(2 * time.Millisecond):
		}
		// A count read while A still holds the slot afterwards is of
		// copies made while A held it: A keeps its slot until it ends.
		if n := hb.c.BackgroundPages.Load(); n != 0 && slots.held(ra.u) {
			t.Fatalf("the second filler copied %d pages in the background while the first held the only slot", n)
		}
	}
	if errA != nil {
		t.Fatalf("first filler: %v", errA)
	}
	if hb.c.FaultPages.Load() == 0 {
		t.Fatal("the second filler did not answer its task's fault")
	}
	waitFiller(t, doneB)
	if got := hb.c.FaultPages.Load() + hb.c.BackgroundPages.Load(); got != pages {
		t.Fatalf("second filler copied %d pages, want %d", got, pages)
	}
	for _, p := range []int{0, pages / 2, pages - 1} {
		wantPage(t, ra.mem, p, byte((p+1)%256))
		wantPage(t, rb.mem, p, byte((p+1)%256))
	}
	if slots.peak != 1 || len(slots.holders) != 0 || len(slots.queue) != 0 {
		t.Fatalf("slots after both fillers: peak %d, %d held, %d queued", slots.peak, len(slots.holders), len(slots.queue))
	}
}

func (s *fillSlots) held(u *uffd) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holders[u]
}

// TestFillerReadsAheadOfOrderedFaults: a filler that has no slot copies
// nothing in the background, yet a task reading its memory in order waits
// on a few faults, not on one per page: each fault where the last
// read-ahead ended reads twice as far ahead.
func TestFillerReadsAheadOfOrderedFaults(t *testing.T) {
	const pages = 1024
	slots := newFillSlots(1)
	if !slots.take(pipeUffd(t)) { // the only slot is someone else's
		t.Fatal("no slot for the holder")
	}
	r := newRegion(t, pages)
	h := &testHost{}
	h.state.Store(int32(running))
	f := newFiller(r.u, newPending([]span{{r.addr(0), r.addr(pages), 0}}), source(pages), h)
	f.slots = slots
	done := runFiller(t, f)
	for p := range pages {
		wantPage(t, r.mem, p, byte((p+1)%256))
	}
	waitFiller(t, done)
	if n := h.c.BackgroundPages.Load(); n != 0 {
		t.Fatalf("a filler without a slot copied %d pages in the background", n)
	}
	// 1 + 16 + 32 + 64 + ... pages: 7 faults read 1024 pages in order.
	if n := h.c.Faults.Load(); n > 10 {
		t.Fatalf("%d faults to read %d pages in order; want a read-ahead that doubles", n, pages)
	}
	t.Logf("%d faults for %d pages read in order", h.c.Faults.Load(), pages)
}

// TestFillerReadsNoFurtherWhileAShareIsPending: until a pending share is
// settled, a fault is answered with its page alone, so that the module
// still finds the area's other pages missing and shares it whole.
func TestFillerReadsNoFurtherWhileAShareIsPending(t *testing.T) {
	const pages = 64
	r := newRegion(t, pages)
	h := &testHost{}
	h.state.Store(int32(running))
	f := newFiller(r.u, newPending([]span{{r.addr(0), r.addr(pages), 0}}), source(pages), h)
	f.share = &shareState{req: make(chan chan shareResult), settled: make(chan struct{})}
	done := runFiller(t, f)
	wantPage(t, r.mem, 3, 4)
	wantPage(t, r.mem, 4, 5)
	// A third fault, far off: once its page is counted, whatever the first
	// two faults read ahead is counted too.
	wantPage(t, r.mem, 40, 41)
	answered(t, h, 3)
	if n := h.c.FaultPages.Load() + h.c.BackgroundPages.Load(); n != 3 {
		t.Fatalf("%d pages copied for 3 faults while a share was pending; want only the faulting pages", n)
	}
	h.state.Store(int32(abandoned))
	r.u.interrupt()
	if err := <-done; err != errAbandoned {
		t.Fatalf("abandoned filler returned %v", err)
	}
}
