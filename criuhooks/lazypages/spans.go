package lazypages

import "sort"

// pageSize is the only page size CRIU's x86_64 images use.
const pageSize = 4096

// span is a run of pages a restored task still misses: [start, end) at the
// address the task sees now (it moves when the task mremaps), and src, the
// offset in the pages image of the data for start. The data of a span is
// contiguous in the pages image because spans are cut from pagemap entries
// and only ever split or moved, never joined.
type span struct {
	start, end, src uint64
}

func (s span) len() uint64 { return s.end - s.start }

// head is the first n bytes of s.
func (s span) head(n uint64) span { return span{s.start, s.start + n, s.src} }

// tail is s without its first n bytes.
func (s span) tail(n uint64) span { return span{s.start + n, s.end, s.src + n} }

// pending is the set of pages a task still misses, as sorted,
// non-overlapping spans. Everything the daemon knows about a task's memory
// state is here: a page is in the set exactly when the task has not been
// given it yet and may still fault on it.
type pending struct {
	spans []span
	bytes uint64
}

func newPending(spans []span) *pending {
	p := &pending{spans: append([]span(nil), spans...)}
	sort.Slice(p.spans, func(i, j int) bool { return p.spans[i].start < p.spans[j].start })
	for _, s := range p.spans {
		p.bytes += s.len()
	}
	return p
}

func (p *pending) empty() bool { return len(p.spans) == 0 }

func (p *pending) clone() *pending {
	return &pending{spans: append([]span(nil), p.spans...), bytes: p.bytes}
}

// after is the index of the first span that ends after addr.
func (p *pending) after(addr uint64) int {
	return sort.Search(len(p.spans), func(i int) bool { return p.spans[i].end > addr })
}

// contains reports whether the page at addr is still missing.
func (p *pending) contains(addr uint64) bool {
	i := p.after(addr)
	return i < len(p.spans) && p.spans[i].start <= addr
}

// take removes up to limit bytes starting at addr, which must be in the set,
// and returns them. It returns false when addr is not missing.
func (p *pending) take(addr, limit uint64) (span, bool) {
	i := p.after(addr)
	if i == len(p.spans) || p.spans[i].start > addr {
		return span{}, false
	}
	s := p.spans[i]
	piece := s.tail(addr - s.start)
	if piece.len() > limit {
		piece = piece.head(limit)
	}
	p.cut(i, piece.start, piece.end)
	return piece, true
}

// next removes and returns up to limit bytes of the first missing run at or
// after cursor, wrapping around to the lowest address when nothing is
// missing above cursor. Filling forward from the last fault keeps ahead of a
// task that reads its memory in order.
func (p *pending) next(cursor, limit uint64) (span, bool) {
	if p.empty() {
		return span{}, false
	}
	i := p.after(cursor)
	if i == len(p.spans) {
		return p.take(p.spans[0].start, limit)
	}
	return p.take(max(cursor, p.spans[i].start), limit)
}

// cut removes [start, end) from span i, which contains it.
func (p *pending) cut(i int, start, end uint64) {
	s := p.spans[i]
	p.bytes -= end - start
	left, right := s.head(start-s.start), s.tail(end-s.start)
	switch {
	case left.len() == 0 && right.len() == 0:
		p.spans = append(p.spans[:i], p.spans[i+1:]...)
	case left.len() == 0:
		p.spans[i] = right
	case right.len() == 0:
		p.spans[i] = left
	default:
		p.spans[i] = left
		p.spans = append(p.spans, span{})
		copy(p.spans[i+2:], p.spans[i+1:])
		p.spans[i+1] = right
	}
}

// put returns a span that was taken and not filled. It must not overlap
// anything in the set.
func (p *pending) put(s span) {
	if s.len() == 0 {
		return
	}
	i := p.after(s.start)
	p.spans = append(p.spans, span{})
	copy(p.spans[i+1:], p.spans[i:])
	p.spans[i] = s
	p.bytes += s.len()
}

// remove forgets [start, end): the task unmapped it or threw its contents
// away, so it must never be filled.
func (p *pending) remove(start, end uint64) {
	p.extract(start, end)
}

// extract removes [start, end) and returns the pieces that were in it.
func (p *pending) extract(start, end uint64) []span {
	var out []span
	for i := p.after(start); i < len(p.spans) && p.spans[i].start < end; {
		s := p.spans[i]
		lo, hi := max(s.start, start), min(s.end, end)
		out = append(out, s.tail(lo-s.start).head(hi-lo))
		before := len(p.spans)
		p.cut(i, lo, hi)
		if len(p.spans) >= before {
			i++ // s kept a part below lo (or was split): skip it
		}
	}
	return out
}

// move follows an mremap of [from, from+n) to [to, to+n). Missing pages that
// were at the destination are gone (mremap unmaps whatever it replaces);
// missing pages of the source range now miss at their new address.
func (p *pending) move(from, to, n uint64) {
	moved := p.extract(from, from+n)
	p.remove(to, to+n)
	for _, s := range moved {
		s.start, s.end = s.start-from+to, s.end-from+to
		p.put(s)
	}
}
