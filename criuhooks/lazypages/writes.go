package lazypages

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// Incremental drains. A branch capture tracks its source's writes
// (runtime/fork's write tracking): its images directory then holds
// WritesFile, saying per task which areas were tracked since the base (the
// last branch's capture) and which of their pages were written since. A
// page of a tracked area that was not written is the base's, and the drain
// takes it from the base branch's images instead of the twin, whose reads
// are what the source pays for; every other page comes from the twin.

// WritesFile, in a plan's images directory, is its capture's Writes.
const WritesFile = "tclone-writes.json"

// Range is a run of addresses, [Start, End).
type Range struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// TaskWrites is one task's tracking: its areas whose writes were tracked
// since the base, and the pages written in them since, both sorted.
type TaskWrites struct {
	Tracked []Range `json:"tracked"`
	Written []Range `json:"written"`
}

// Writes is a capture's tracking, by image pid, against branch Base.
type Writes struct {
	Base  string                `json:"base"`
	Tasks map[int32]*TaskWrites `json:"tasks"`
}

// ReadWrites reads dir's WritesFile; none is no error (nil).
func ReadWrites(dir string) (*Writes, error) {
	b, err := os.ReadFile(filepath.Join(dir, WritesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var w Writes
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("lazy pages: %s: %w", WritesFile, err)
	}
	for _, t := range w.Tasks {
		if t == nil || !sortedRanges(t.Tracked) || !sortedRanges(t.Written) {
			return nil, fmt.Errorf("lazy pages: %s holds ranges out of order", WritesFile)
		}
	}
	return &w, nil
}

func sortedRanges(rs []Range) bool {
	for i, r := range rs {
		if r.End <= r.Start || r.Start%pageSize != 0 || r.End%pageSize != 0 || i > 0 && r.Start < rs[i-1].End {
			return false
		}
	}
	return true
}

// run says where the run of pages from addr on (up to end) comes from:
// the base (unwritten pages of a tracked area) or not, and where the run
// ends.
func (t *TaskWrites) run(addr, end uint64) (fromBase bool, runEnd uint64) {
	in := func(rs []Range) (bool, uint64) {
		i := sort.Search(len(rs), func(i int) bool { return rs[i].End > addr })
		if i == len(rs) {
			return false, end
		}
		if rs[i].Start <= addr {
			return true, min(rs[i].End, end)
		}
		return false, min(rs[i].Start, end)
	}
	tracked, tEnd := in(t.Tracked)
	written, wEnd := in(t.Written)
	return tracked && !written, min(tEnd, wEnd)
}

// BaseTask is a task's images in the base branch: its pagemap, a file,
// and the pages image it names, read where the branch keeps it.
type BaseTask struct {
	Pagemap string
	Pages   io.ReaderAt
}

// basePages is a task's pages in the base's images: its pagemap's present
// entries, in address order, and their pages image.
type basePages struct {
	r       io.ReaderAt
	entries []baseEntry
	// err is the first read that failed: its pages, and the task's
	// later ones, came from the snapshot.
	err error
}

type baseEntry struct {
	start, end, off uint64
}

// openBase reads a task's pagemap in the base.
func openBase(t *BaseTask) (*basePages, error) {
	_, entries, err := readPagemap(t.Pagemap)
	if err != nil {
		return nil, err
	}
	b := &basePages{r: t.Pages}
	var off uint64
	for _, e := range entries {
		if e.Flags&pagePresent == 0 {
			continue
		}
		n := e.Pages * pageSize
		b.entries = append(b.entries, baseEntry{e.Vaddr, e.Vaddr + n, off})
		off += n
	}
	sort.Slice(b.entries, func(i, j int) bool { return b.entries[i].start < b.entries[j].start })
	return b, nil
}

// span says how much of [addr, addr+max) the base holds from addr on
// (held), or, when it holds nothing at addr, how far the gap goes (gap).
func (b *basePages) span(addr, max uint64) (held, gap uint64) {
	i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].end > addr })
	if i == len(b.entries) {
		return 0, max
	}
	if e := b.entries[i]; e.start > addr {
		return 0, min(e.start-addr, max)
	}
	for ; i < len(b.entries) && b.entries[i].start <= addr+held && held < max; i++ {
		held = min(b.entries[i].end-addr, max)
	}
	return held, 0
}

// read fills buf with the base's pages from addr on, which it must hold
// (span).
func (b *basePages) read(buf []byte, addr uint64) error {
	for done := uint64(0); done < uint64(len(buf)); {
		a := addr + done
		i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].end > a })
		if i == len(b.entries) || b.entries[i].start > a {
			return fmt.Errorf("lazy pages: the base has no page at %#x", a)
		}
		e := b.entries[i]
		n := min(uint64(len(buf))-done, e.end-a)
		if _, err := b.r.ReadAt(buf[done:done+n], int64(e.off+(a-e.start))); err != nil {
			return fmt.Errorf("lazy pages: reading the base's pages at %#x: %w", a, err)
		}
		done += n
	}
	return nil
}

// PagesImageOf names the pages image the pagemap at path refers to.
func PagesImageOf(path string) (string, error) {
	id, _, err := readPagemap(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pages-%d.img", id), nil
}
