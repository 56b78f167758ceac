package lazypages

import (
	"runtime"
	"sync"
)

// fillSlots bounds how many fillers of one daemon copy pages in the
// background at once, across all of its siblings (defaultFillSlots). Every task has a filler,
// so a fan-out of 16 siblings of 10 tasks had 160 threads copying pages no
// task waited for: even niced, together they outweighed the restores of the
// siblings still to come and the siblings' first commands. A filler without
// a slot still answers its task's faults at once; it only waits to copy
// ahead of them.
//
// A filler keeps its slot until its task is complete (or gone), so tasks
// fill one after another and each is complete as early as it can be. Slots
// are handed over in the order fillers asked for them.
type fillSlots struct {
	mu      sync.Mutex
	max     int
	holders map[*uffd]bool
	queue   []*uffd
	// peak is the most slots held at once (for tests).
	peak int
}

// defaultFillSlots leaves half the machine's CPUs to the siblings' own
// work, and to restores and execs, while memory fills.
func defaultFillSlots() int { return max(1, runtime.NumCPU()/2) }

// newFillSlots bounds background filling to n fillers at once (n >= 1).
func newFillSlots(n int) *fillSlots {
	return &fillSlots{max: n, holders: map[*uffd]bool{}}
}

// take reports whether the filler of u holds a slot, giving it one if one
// is free. If none is, the filler is queued, and its wait on u is
// interrupted when a slot becomes its own. A nil fillSlots has no bound.
func (s *fillSlots) take(u *uffd) bool {
	if s == nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders[u] {
		return true
	}
	if len(s.holders) < s.max {
		s.hold(u)
		return true
	}
	for _, q := range s.queue {
		if q == u {
			return false
		}
	}
	s.queue = append(s.queue, u)
	return false
}

// give ends the claim of u's filler: its slot, if it has one, goes to the
// first filler queued; if it was queued, it leaves the queue.
func (s *fillSlots) give(u *uffd) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.queue {
		if q == u {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
	if !s.holders[u] {
		return
	}
	delete(s.holders, u)
	if len(s.queue) > 0 {
		next := s.queue[0]
		s.queue = s.queue[1:]
		s.hold(next)
		next.interrupt()
	}
}

func (s *fillSlots) hold(u *uffd) {
	s.holders[u] = true
	s.peak = max(s.peak, len(s.holders))
}
