package lazypages

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks/internal/pagemapimg"
	"google.golang.org/protobuf/proto"
)

// Pagemap entry flags (criu/include/pagemap.h).
const (
	pageInParent = pagemapimg.InParent
	pageLazy     = pagemapimg.Lazy
	pagePresent  = pagemapimg.Present
)

// taskImage is what the dump recorded of one task's lazily restorable
// memory: the spans restore --lazy-pages leaves missing, at their dump-time
// addresses (which are also their addresses right after restore), and which
// pages image holds their data.
type taskImage struct {
	pid     int32
	pagesID uint32
	lazy    []span
	bytes   uint64
	// areas are the VMAs that hold lazy spans, whole (src unused): what a
	// snapshot can share with the task, one area at a time.
	areas []span
}

// Images is a dump's memory, read once and shared by every sibling restored
// from it. Pages images are mapped read-only, so that filling a sibling
// copies from the page cache (the tmpfs store) straight into the task.
type Images struct {
	dir string
	// snapshots, if set, hold each task's memory (Options.Snapshots).
	snapshots map[int32]*os.File

	mu    sync.Mutex
	tasks map[int32]*taskImage
	pages map[uint32][]byte
	// With Options.Drain: each task's snapshot and its readers, the tasks
	// whose pages are in an image of their own by now, and progress.
	drainRelease func(int32)
	slots        map[int32]*snapSlot
	drainedTasks map[int32]bool
	drainState   DrainState
	drainCond    *sync.Cond
}

// OpenImages opens the dump in dir. Task images are read when a task of a
// sibling first arrives.
func OpenImages(dir string) (*Images, error) {
	if _, err := os.Stat(filepath.Join(dir, "pstree.img")); err != nil {
		return nil, fmt.Errorf("lazy pages: %s is not a CRIU dump (no pstree.img): %w", dir, err)
	}
	im := &Images{dir: dir, tasks: map[int32]*taskImage{}, pages: map[uint32][]byte{},
		slots: map[int32]*snapSlot{}, drainedTasks: map[int32]bool{}}
	im.drainCond = sync.NewCond(&im.mu)
	return im, nil
}

// slot is task pid's snapshot slot, made on first use.
func (im *Images) slot(pid int32) *snapSlot {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.slotLocked(pid)
}

func (im *Images) slotLocked(pid int32) *snapSlot {
	sl := im.slots[pid]
	if sl == nil {
		sl = &snapSlot{pid: pid, src: snapshotPages{im.snapshots[pid]}, release: im.drainRelease}
		im.slots[pid] = sl
	}
	return sl
}

// releaseSnapshots frees every snapshot not freed yet (Close).
func (im *Images) releaseSnapshots() {
	im.mu.Lock()
	var all []*snapSlot
	for pid := range im.snapshots {
		all = append(all, im.slotLocked(pid))
	}
	im.mu.Unlock()
	for _, sl := range all {
		sl.free()
	}
}

// loadTask reads task pid's image once.
func (im *Images) loadTask(pid int32) (*taskImage, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.loadTaskLocked(pid)
}

func (im *Images) loadTaskLocked(pid int32) (*taskImage, error) {
	if t, ok := im.tasks[pid]; ok {
		return t, nil
	}
	t, err := loadTaskImage(im.dir, pid, im.snapshots != nil && !im.drainedTasks[pid])
	if err != nil {
		return nil, err
	}
	im.tasks[pid] = t
	return t, nil
}

// Close unmaps the pages images. No sibling may be served afterwards.
func (im *Images) Close() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	var errs []error
	for id, data := range im.pages {
		if err := unix.Munmap(data); err != nil {
			errs = append(errs, fmt.Errorf("unmap pages-%d.img: %w", id, err))
		}
		delete(im.pages, id)
	}
	return errors.Join(errs...)
}

// task returns the lazy memory of the task with image pid pid and where
// its spans' data is: the pages image they point into, or the task's
// snapshot.
func (im *Images) task(pid int32) (*taskImage, pageSource, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	t, err := im.loadTaskLocked(pid)
	if err != nil {
		return nil, nil, err
	}
	if im.snapshots != nil && !im.drainedTasks[pid] {
		snap := im.snapshots[pid]
		if snap == nil && len(t.lazy) > 0 {
			return nil, nil, fmt.Errorf("lazy pages: no snapshot holds the memory of task %d, which has %d lazy bytes (the capture took snapshots of other tasks only)", pid, t.bytes)
		}
		if snap == nil || im.drainRelease == nil {
			// A task without private anonymous memory has no snapshot,
			// and nothing to read from one.
			return t, snapshotPages{snap}, nil
		}
		sl := im.slotLocked(pid)
		sl.mu.Lock()
		gone := sl.gone
		sl.mu.Unlock()
		if gone {
			return nil, nil, fmt.Errorf("lazy pages: the snapshot of task %d was released before its pages were drained", pid)
		}
		return t, drainSource{snapshotPages: sl.src, slot: sl}, nil
	}
	data, ok := im.pages[t.pagesID]
	if !ok {
		var err error
		if data, err = mapPages(filepath.Join(im.dir, fmt.Sprintf("pages-%d.img", t.pagesID))); err != nil {
			return nil, nil, err
		}
		im.pages[t.pagesID] = data
	}
	if err := t.fits(uint64(len(data))); err != nil {
		return nil, nil, err
	}
	return t, mappedPages(data), nil
}

func (t *taskImage) fits(size uint64) error {
	for _, s := range t.lazy {
		if s.src+s.len() > size {
			return fmt.Errorf("lazy pages: pages-%d.img is %d bytes, but the pagemap of task %d needs %d: the dump is truncated",
				t.pagesID, size, t.pid, s.src+s.len())
		}
	}
	return nil
}

func mapPages(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: open pages image: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("lazy pages: stat %s: %w", path, err)
	}
	if st.Size() == 0 {
		return []byte{}, nil
	}
	// Not MAP_POPULATE: populating 1 GiB took 105 ms here, all before the
	// first fault could be answered, while the daemon's own faults on the
	// mapping (16 pages each, by fault-around) cost 68 ms spread over the
	// whole fill.
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: map %s: %w", path, err)
	}
	return data, nil
}

// PagesBytes is the size of a dump's pages images: the memory CRIU wrote,
// as opposed to what it left to a lazy restore.
func PagesBytes(dir string) (uint64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return 0, err
		}
		n += uint64(st.Size())
	}
	return n, nil
}

// pagemapEntry is one pagemap_entry with the page count and flags resolved
// the way CRIU's init_compat_pagemap_entry does.
type pagemapEntry = pagemapimg.Entry

// loadTaskImage reads a task's lazy spans. fromSnapshot: their data is in
// a snapshot, at their own addresses, and need not be in the pages image.
func loadTaskImage(dir string, pid int32, fromSnapshot bool) (*taskImage, error) {
	pagesID, entries, err := readPagemap(filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", pid)))
	if err != nil {
		return nil, err
	}
	vmas, err := readVMAs(filepath.Join(dir, fmt.Sprintf("mm-%d.img", pid)))
	if err != nil {
		return nil, err
	}
	t := &taskImage{pid: pid, pagesID: pagesID}
	var off uint64
	for _, e := range entries {
		n := e.Pages * pageSize
		if e.Flags&pageLazy != 0 {
			src := off
			if fromSnapshot {
				src = e.Vaddr
			} else if e.Flags&pagePresent == 0 {
				return nil, fmt.Errorf("lazy pages: pagemap-%d.img has lazy pages at %#x that are not in its pages image "+
					"(a dump made with --lazy-pages keeps them at its page server); dump without --lazy-pages", pid, e.Vaddr)
			}
			for _, s := range splitAtVMAs(span{e.Vaddr, e.Vaddr + n, src}, vmas) {
				t.lazy = append(t.lazy, s)
				t.bytes += s.len()
				t.addArea(s, vmas)
			}
		}
		if e.Flags&pagePresent != 0 {
			off += n
		}
	}
	return t, nil
}

// addArea records the VMA that holds s (one VMA, since s was split at them).
func (t *taskImage) addArea(s span, vmas []*vma.VmaEntry) {
	i := sort.Search(len(vmas), func(i int) bool { return vmas[i].GetEnd() > s.start })
	if i == len(vmas) {
		return
	}
	a := span{start: vmas[i].GetStart(), end: vmas[i].GetEnd()}
	if n := len(t.areas); n == 0 || t.areas[n-1] != a {
		t.areas = append(t.areas, a)
	}
}

// splitAtVMAs cuts s where VMAs end: one UFFDIO_COPY may not cross a VMA
// boundary. Parts of s outside every VMA are dropped; a task cannot fault
// there.
func splitAtVMAs(s span, vmas []*vma.VmaEntry) []span {
	var out []span
	i := sort.Search(len(vmas), func(i int) bool { return vmas[i].GetEnd() > s.start })
	for ; i < len(vmas) && vmas[i].GetStart() < s.end; i++ {
		lo, hi := max(s.start, vmas[i].GetStart()), min(s.end, vmas[i].GetEnd())
		out = append(out, s.tail(lo-s.start).head(hi-lo))
	}
	return out
}

func readPagemap(path string) (uint32, []pagemapEntry, error) {
	im, err := pagemapimg.Read(path)
	if err != nil {
		return 0, nil, fmt.Errorf("lazy pages: %w", err)
	}
	return im.PagesID, im.Entries, nil
}

func readVMAs(path string) ([]*vma.VmaEntry, error) {
	img, err := decodeImage(path, &mm.MmEntry{})
	if err != nil {
		return nil, err
	}
	if len(img.Entries) != 1 {
		return nil, fmt.Errorf("lazy pages: %s holds %d mm entries, want 1", path, len(img.Entries))
	}
	vmas := append([]*vma.VmaEntry(nil), img.Entries[0].Message.(*mm.MmEntry).GetVmas()...)
	sort.Slice(vmas, func(i, j int) bool { return vmas[i].GetStart() < vmas[j].GetStart() })
	return vmas, nil
}

func decodeImage(path string, entry proto.Message) (*crit.CriuImage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: %w", err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(entry)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: decode %s: %w", path, err)
	}
	return img, nil
}
