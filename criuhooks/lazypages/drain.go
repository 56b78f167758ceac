package lazypages

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
)

// Draining. A twin's memory is the source's at the fork instant only while
// the twin lives, and a twin is a process in the source's container: the
// sooner it is gone, the better. So a daemon given twins (Options.Drain)
// copies each task's lazy pages out of its twin into a pages image of the
// task's own, at once and smallest task first, and rewrites the task's
// pagemap to point there (PE_PRESENT, as a plain dump has it). From then on
// new fillers read the image; the twin is released (Drain.Release) as soon
// as no filler still reads it. Once every task is drained the plan holds
// plain page images (DrainedMarker), which any restore can use, copying
// ones included, with or without this daemon.

// DrainedMarker, in a plan's images directory, says that its page images
// hold every page: its twins were drained.
const DrainedMarker = "tclone-drained"

// drainedPagesID is the pages image id of a task's drained pages: CRIU
// numbers its own from 1, a few per dump.
func drainedPagesID(pid int32) uint32 { return 1<<30 | uint32(pid) }

// Drain configures draining (Options.Drain).
type Drain struct {
	// PlanImages is the plan's own images directory, which gets the
	// drained images too, if it still exists.
	PlanImages string
	// Release is called, once, when a task's snapshot (twin) is no
	// longer read by anything: drained and left by its last filler, or
	// at Close.
	Release func(pid int32)
	// Writes, for an incremental drain, is the capture's write tracking
	// (WritesFile), and Base gives the base branch's images of a task
	// (nil for a task the base does not have): the pages the tracking
	// says were not written come from there.
	Writes *Writes
	Base   func(pid int32) (*BaseTask, error)
}

// base opens task pid's pages in the base, for an incremental drain;
// nil when the drain takes every page from the snapshot, which it does too
// when the base cannot be read (removed since): the snapshot is still
// there, and holds every page. Why is then the drain state's BaseErr.
func (im *Images) base(cfg *Drain, pid int32) (*TaskWrites, *basePages) {
	if cfg.Writes == nil || cfg.Base == nil || cfg.Writes.Tasks[pid] == nil {
		return nil, nil
	}
	t, err := cfg.Base(pid)
	if err == nil && t == nil {
		return nil, nil // a process the base did not have
	}
	var b *basePages
	if err == nil {
		b, err = openBase(t)
	}
	if err != nil {
		im.baseFailed(pid, err)
		return nil, nil
	}
	return cfg.Writes.Tasks[pid], b
}

// baseFailed records the first failure to read the base: the task's pages
// came from its snapshot.
func (im *Images) baseFailed(pid int32, err error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.drainState.BaseErr == "" {
		im.drainState.BaseErr = fmt.Sprintf("task %d: %v", pid, err)
	}
}

// snapSlot is a task's snapshot and who reads it.
type snapSlot struct {
	pid     int32
	src     snapshotPages
	mu      sync.Mutex
	users   int
	drained bool
	gone    bool
	release func(int32)
}

// drainSource is a snapshot that fillers hold while they read it.
type drainSource struct {
	snapshotPages
	slot *snapSlot
}

func (d drainSource) hold() {
	d.slot.mu.Lock()
	d.slot.users++
	d.slot.mu.Unlock()
}

func (d drainSource) drop() {
	d.slot.mu.Lock()
	d.slot.users--
	free := d.slot.users == 0 && d.slot.drained
	d.slot.mu.Unlock()
	if free {
		d.slot.free()
	}
}

// free releases the slot's snapshot, once.
func (s *snapSlot) free() {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return
	}
	s.gone = true
	s.mu.Unlock()
	if s.release != nil {
		s.release(s.pid)
	}
}

// heldSource is a source its fillers must hold while they read it.
type heldSource interface {
	pageSource
	hold()
	drop()
}

// DrainState is how far draining has got.
type DrainState struct {
	Tasks   int   `json:"tasks"`
	Drained int   `json:"drained"`
	Bytes   int64 `json:"bytes"`
	// FromBase is what an incremental drain took from the base branch
	// instead of the snapshots (Bytes counts only those); BaseErr, why it
	// took a task's pages from its snapshot all the same.
	FromBase int64  `json:"from_base,omitempty"`
	BaseErr  string `json:"base_error,omitempty"`
	Done     bool   `json:"done"`
	Err      string `json:"error,omitempty"`
}

// drain copies every task's lazy pages out of its snapshot; see the top of
// this file. It runs in its own goroutine and ends early when stop closes.
func (im *Images) drain(cfg *Drain, stop <-chan struct{}) error {
	order, err := im.drainOrder()
	if err != nil {
		return im.drainFailed(err)
	}
	im.mu.Lock()
	im.drainState.Tasks = len(order)
	im.mu.Unlock()
	for _, pid := range order {
		select {
		case <-stop:
			return nil
		default:
		}
		n, fromBase, err := im.drainTask(cfg, pid)
		if err != nil {
			return im.drainFailed(fmt.Errorf("draining task %d: %w", pid, err))
		}
		im.mu.Lock()
		im.drainState.Drained++
		im.drainState.Bytes += n
		im.drainState.FromBase += fromBase
		im.mu.Unlock()
	}
	if cfg.PlanImages != "" {
		// The write tracking served its purpose: the images are whole.
		os.Remove(filepath.Join(cfg.PlanImages, WritesFile))
		if err := os.WriteFile(filepath.Join(cfg.PlanImages, DrainedMarker), nil, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return im.drainFailed(err)
		}
	}
	os.Remove(filepath.Join(im.dir, WritesFile))
	im.mu.Lock()
	im.drainState.Done = true
	im.mu.Unlock()
	im.drainCond.Broadcast()
	return nil
}

func (im *Images) drainFailed(err error) error {
	im.mu.Lock()
	im.drainState.Err = err.Error()
	im.mu.Unlock()
	im.drainCond.Broadcast()
	return err
}

// WaitDrained waits until every task is drained, or draining failed.
func (im *Images) WaitDrained() (DrainState, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	for !im.drainState.Done && im.drainState.Err == "" {
		im.drainCond.Wait()
	}
	if im.drainState.Err != "" {
		return im.drainState, errors.New(im.drainState.Err)
	}
	return im.drainState, nil
}

// Drained reports draining's progress.
func (im *Images) Drained() DrainState {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.drainState
}

// drainOrder lists the tasks with snapshots, fewest lazy bytes first: a
// small process's twin goes at once, whatever the big ones cost.
func (im *Images) drainOrder() ([]int32, error) {
	type task struct {
		pid   int32
		bytes uint64
	}
	var tasks []task
	for pid := range im.snapshots {
		t, err := im.loadTask(pid)
		if err != nil {
			return nil, err
		}
		tasks = append(tasks, task{pid, t.bytes})
	}
	sort.Slice(tasks, func(i, j int) bool {
		if tasks[i].bytes != tasks[j].bytes {
			return tasks[i].bytes < tasks[j].bytes
		}
		return tasks[i].pid < tasks[j].pid
	})
	out := make([]int32, len(tasks))
	for i, t := range tasks {
		out[i] = t.pid
	}
	return out, nil
}

// drainTask writes task pid's drained pages image and pagemap, switches the
// daemon to them, and frees the snapshot once no filler reads it. It
// returns the bytes it copied out of the snapshot, and those it took from
// the base branch instead.
func (im *Images) drainTask(cfg *Drain, pid int32) (int64, int64, error) {
	slot := im.slot(pid)
	pagemapPath := filepath.Join(im.dir, fmt.Sprintf("pagemap-%d.img", pid))
	img, err := decodeImage(pagemapPath, &pagemap.PagemapEntry{})
	if err != nil {
		return 0, 0, err
	}
	_, entries, err := readPagemap(pagemapPath)
	if err != nil {
		return 0, 0, err
	}
	writes, base := im.base(cfg, pid)
	head := img.Entries[0].Message.(*pagemap.PagemapHead)
	oldPages := filepath.Join(im.dir, fmt.Sprintf("pages-%d.img", head.GetPagesId()))
	newID := drainedPagesID(pid)
	newPages := filepath.Join(im.dir, fmt.Sprintf("pages-%d.img", newID))
	copied, fromBase, err := writeDrained(newPages, oldPages, entries, slot.src, writes, base)
	if err != nil {
		os.Remove(newPages + ".tmp")
		return 0, 0, err
	}
	if base != nil && base.err != nil {
		im.baseFailed(pid, base.err)
	}
	// The pagemap says so last: a reader sees the old pagemap and pages,
	// or the new ones, never a mix.
	head.PagesId = &newID
	for i, e := range entries {
		if e.Flags&pageLazy != 0 && e.Flags&pagePresent == 0 {
			pe := img.Entries[i+1].Message.(*pagemap.PagemapEntry)
			flags := e.Flags | pagePresent
			pe.Flags = &flags
		}
	}
	if err := writeImage(img, pagemapPath); err != nil {
		return 0, 0, err
	}
	if err := publish(cfg.PlanImages, newPages, pagemapPath); err != nil {
		return 0, 0, err
	}
	t, err := loadTaskImage(im.dir, pid, false)
	if err != nil {
		return 0, 0, err
	}
	data, err := mapPages(newPages)
	if err != nil {
		return 0, 0, err
	}
	if err := t.fits(uint64(len(data))); err != nil {
		return 0, 0, err
	}
	im.mu.Lock()
	im.tasks[pid] = t
	im.pages[newID] = data
	im.drainedTasks[pid] = true
	im.mu.Unlock()
	slot.mu.Lock()
	slot.drained = true
	free := slot.users == 0
	slot.mu.Unlock()
	if free {
		slot.free()
	}
	return copied, fromBase, nil
}

// writeDrained writes path: the pages of entries in pagemap order, the
// present ones from the old pages image, the lazy ones from the snapshot,
// but, with writes and base, those that writes says were not written since
// the base, which come from the base where it holds them. It returns the
// bytes read from the snapshot and from the base.
func writeDrained(path, oldPages string, entries []pagemapEntry, src snapshotPages, writes *TaskWrites, base *basePages) (int64, int64, error) {
	old, err := os.Open(oldPages)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, err
	}
	if old != nil {
		defer old.Close()
	}
	out, err := os.OpenFile(path+".tmp", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer out.Close()
	buf := make([]byte, 4<<20)
	var copied, fromBase int64
	var oldOff int64
	for _, e := range entries {
		n := int64(e.Pages * pageSize)
		switch {
		case e.Flags&pagePresent != 0:
			if old == nil {
				return 0, 0, fmt.Errorf("%s is missing, and its pagemap has present pages", oldPages)
			}
			if _, err := io.CopyBuffer(out, io.NewSectionReader(old, oldOff, n), buf); err != nil {
				return 0, 0, fmt.Errorf("copying %s: %w", oldPages, err)
			}
			oldOff += n
		case e.Flags&pageLazy != 0:
			for done := int64(0); done < n; {
				addr := e.Vaddr + uint64(done)
				chunk := min(n-done, int64(len(buf)))
				useBase := false
				if writes != nil && base != nil {
					var runEnd uint64
					useBase, runEnd = writes.run(addr, addr+uint64(chunk))
					chunk = int64(runEnd - addr)
					if useBase {
						// Only what the base holds; a gap in it comes
						// from the snapshot.
						held, gap := base.span(addr, uint64(chunk))
						useBase = held > 0
						chunk = int64(max(held, gap))
					}
				}
				b := buf[:chunk]
				var data []byte
				if useBase && base.err == nil {
					if base.err = base.read(b, addr); base.err == nil {
						data = b
						fromBase += chunk
					}
				}
				if data == nil {
					if data, err = src.at(&b, uint64(chunk), addr); err != nil {
						return 0, 0, err
					}
					copied += chunk
				}
				if _, err := out.Write(data); err != nil {
					return 0, 0, err
				}
				done += chunk
			}
		}
	}
	if err := out.Close(); err != nil {
		return 0, 0, err
	}
	return copied, fromBase, os.Rename(path+".tmp", path)
}

// publish gives the plan's own images directory the drained files, if it
// still exists: a link to the pages image, and the pagemap put in place of
// the old one.
func publish(planImages, pages, pagemap string) error {
	if planImages == "" {
		return nil
	}
	if _, err := os.Stat(planImages); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	dst := filepath.Join(planImages, filepath.Base(pages))
	os.Remove(dst)
	if err := os.Link(pages, dst); err != nil {
		return fmt.Errorf("publishing %s: %w", filepath.Base(pages), err)
	}
	tmp := filepath.Join(planImages, filepath.Base(pagemap)+".drained")
	os.Remove(tmp)
	if err := os.Link(pagemap, tmp); err != nil {
		return fmt.Errorf("publishing %s: %w", filepath.Base(pagemap), err)
	}
	return os.Rename(tmp, filepath.Join(planImages, filepath.Base(pagemap)))
}

// writeImage encodes img to path, replacing it.
func writeImage(img *crit.CriuImage, path string) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
