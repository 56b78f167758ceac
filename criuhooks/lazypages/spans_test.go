package lazypages

import (
	"math/rand"
	"reflect"
	"testing"
)

const pg = pageSize

// model is a page-by-page reference for pending: missing page address ->
// offset of its data in the pages image.
type model map[uint64]uint64

func modelOf(p *pending) model {
	m := model{}
	for _, s := range p.spans {
		for a := s.start; a < s.end; a += pg {
			m[a] = s.src + a - s.start
		}
	}
	return m
}

func checkInvariants(t *testing.T, p *pending) {
	t.Helper()
	var total uint64
	for i, s := range p.spans {
		if s.len() == 0 || s.start%pg != 0 || s.end%pg != 0 {
			t.Fatalf("span %d = %+v: empty or not page aligned", i, s)
		}
		if i > 0 && p.spans[i-1].end > s.start {
			t.Fatalf("spans %d and %d overlap or are unsorted: %+v", i-1, i, p.spans)
		}
		total += s.len()
	}
	if total != p.bytes {
		t.Fatalf("bytes = %d, spans hold %d", p.bytes, total)
	}
}

func TestPendingTakeSplitsAndPutRestores(t *testing.T) {
	p := newPending([]span{{10 * pg, 20 * pg, 0}, {30 * pg, 32 * pg, 10 * pg}})
	before := modelOf(p)

	got, ok := p.take(12*pg, 3*pg)
	if !ok || got != (span{12 * pg, 15 * pg, 2 * pg}) {
		t.Fatalf("take = %+v, %v", got, ok)
	}
	checkInvariants(t, p)
	if p.contains(13*pg) || !p.contains(11*pg) || !p.contains(15*pg) {
		t.Fatalf("after take: %+v", p.spans)
	}
	if _, ok := p.take(13*pg, pg); ok {
		t.Fatal("took a page that is no longer missing")
	}
	p.put(got)
	checkInvariants(t, p)
	if !reflect.DeepEqual(modelOf(p), before) {
		t.Fatalf("put did not restore the set: %+v", p.spans)
	}
}

func TestPendingTakeClipsAtSpanEnd(t *testing.T) {
	p := newPending([]span{{0, 4 * pg, 100 * pg}})
	got, ok := p.take(2*pg, 64*pg)
	if !ok || got != (span{2 * pg, 4 * pg, 102 * pg}) {
		t.Fatalf("take = %+v, %v", got, ok)
	}
}

func TestPendingNextFillsForwardFromCursorThenWraps(t *testing.T) {
	p := newPending([]span{{0, 2 * pg, 0}, {10 * pg, 12 * pg, 2 * pg}})
	got, _ := p.next(11*pg, 16*pg)
	if got != (span{11 * pg, 12 * pg, 3 * pg}) {
		t.Fatalf("next from inside a span = %+v", got)
	}
	got, _ = p.next(12*pg, 16*pg)
	if got != (span{0, 2 * pg, 0}) {
		t.Fatalf("next past the last span did not wrap: %+v", got)
	}
	got, _ = p.next(0, 16*pg)
	if got != (span{10 * pg, 11 * pg, 2 * pg}) {
		t.Fatalf("last piece = %+v", got)
	}
	if _, ok := p.next(0, pg); ok || !p.empty() || p.bytes != 0 {
		t.Fatalf("set not empty: %+v", p)
	}
}

func TestPendingRemoveAcrossSpans(t *testing.T) {
	p := newPending([]span{{0, 4 * pg, 0}, {6 * pg, 8 * pg, 4 * pg}, {9 * pg, 12 * pg, 6 * pg}})
	p.remove(2*pg, 10*pg)
	checkInvariants(t, p)
	want := []span{{0, 2 * pg, 0}, {10 * pg, 12 * pg, 7 * pg}}
	if !reflect.DeepEqual(p.spans, want) {
		t.Fatalf("spans = %+v, want %+v", p.spans, want)
	}
}

func TestPendingMoveKeepsDataAndDropsReplacedPages(t *testing.T) {
	// [0,4) moves onto [20,24), which held missing pages of its own: those
	// are unmapped by the mremap and must not be filled any more.
	p := newPending([]span{{0, 4 * pg, 0}, {22 * pg, 26 * pg, 4 * pg}})
	p.move(0, 20*pg, 4*pg)
	checkInvariants(t, p)
	want := []span{{20 * pg, 24 * pg, 0}, {24 * pg, 26 * pg, 6 * pg}}
	if !reflect.DeepEqual(p.spans, want) {
		t.Fatalf("spans = %+v, want %+v", p.spans, want)
	}
}

func TestPendingCloneIsIndependent(t *testing.T) {
	p := newPending([]span{{0, 4 * pg, 0}})
	c := p.clone()
	p.take(0, pg)
	if !c.contains(0) || c.bytes != 4*pg {
		t.Fatalf("clone changed with its parent: %+v", c)
	}
}

// TestPendingMatchesModel runs random operations against a page-by-page
// model: every page keeps its data offset wherever it moves, and pages leave
// the set only when taken or removed.
func TestPendingMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	const space = 64
	page := func() uint64 { return uint64(rng.Intn(space)) * pg }
	for round := 0; round < 200; round++ {
		p := newPending([]span{{0, 16 * pg, 0}, {20 * pg, 40 * pg, 16 * pg}, {50 * pg, 51 * pg, 36 * pg}})
		m := modelOf(p)
		for op := 0; op < 40; op++ {
			switch rng.Intn(4) {
			case 0:
				a, n := page(), uint64(1+rng.Intn(8))*pg
				if got, ok := p.take(a, n); ok {
					if got.start != a {
						t.Fatalf("take(%#x) started at %#x", a, got.start)
					}
					for x := got.start; x < got.end; x += pg {
						if m[x] != got.src+x-got.start {
							t.Fatalf("page %#x: src %#x, model %#x", x, got.src+x-got.start, m[x])
						}
						delete(m, x)
					}
				} else if _, in := m[a]; in {
					t.Fatalf("take(%#x) missed a missing page", a)
				}
			case 1:
				a, b := page(), page()
				lo, hi := min(a, b), max(a, b)
				p.remove(lo, hi)
				for x := lo; x < hi; x += pg {
					delete(m, x)
				}
			case 2:
				from, to, n := page(), page(), uint64(1+rng.Intn(8))*pg
				p.move(from, to, n)
				moved := model{}
				for x := from; x < from+n; x += pg {
					if src, in := m[x]; in {
						moved[x-from+to] = src
						delete(m, x)
					}
				}
				for x := to; x < to+n; x += pg {
					delete(m, x)
				}
				for x, src := range moved {
					m[x] = src
				}
			case 3:
				if got, ok := p.next(page(), 4*pg); ok {
					p.put(got)
				}
			}
			checkInvariants(t, p)
			if got := modelOf(p); !reflect.DeepEqual(got, m) {
				t.Fatalf("round %d op %d: set diverged from the model\n got %v\nwant %v", round, op, got, m)
			}
		}
	}
}
