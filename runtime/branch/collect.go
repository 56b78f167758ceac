package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Removed says what removing branches freed.
type Removed struct {
	Branches []string `json:"branches,omitempty"`
	// Partial are branches whose writer died before they were complete.
	Partial []string `json:"partial,omitempty"`
	// Chunks no branch uses any more, and the disk bytes they and the
	// removed branches' trees took.
	Chunks int   `json:"chunks"`
	Bytes  int64 `json:"bytes"`
	// ChunksBusy is set when the chunks could not be collected because a
	// branch was being written or read: the next Collect takes them.
	ChunksBusy bool `json:"chunks_busy,omitempty"`
}

// Remove removes the durable branches refs (names or IDs) and the chunks
// only they used. Containers started from them are not touched: they have
// their own copies of everything.
func (s Store) Remove(refs ...string) (Removed, error) {
	var rep Removed
	release, err := s.naming()
	if err != nil {
		return rep, err
	}
	var dirs []string
	for _, ref := range refs {
		b, err := s.Get(ref)
		if errors.Is(err, ErrNotFound) {
			if failed := s.failed(ref); failed != nil {
				dirs = append(dirs, filepath.Join(s.partialDir(), failed.ID))
				rep.Branches = append(rep.Branches, failed.Name)
				continue
			}
		}
		if err != nil {
			release()
			return rep, err
		}
		dirs = append(dirs, s.dirOf(b.ID))
		rep.Branches = append(rep.Branches, b.Name)
	}
	for _, dir := range dirs {
		// Out of sight at once; deleted after.
		id := filepath.Base(dir)
		trash := filepath.Join(s.trashDir(), id)
		if err := os.Rename(dir, trash); err != nil {
			release()
			return rep, fmt.Errorf("removing branch %s: %w", id, err)
		}
	}
	release()
	more, err := s.Collect()
	rep.Partial, rep.Chunks, rep.Bytes, rep.ChunksBusy = more.Partial, more.Chunks, more.Bytes, more.ChunksBusy
	return rep, err
}

// failed finds a branch that failed being written, by name or ID.
func (s Store) failed(ref string) *Info {
	infos, _ := s.partials()
	for _, in := range infos {
		if in.State == StateFailed && (in.Name == ref || in.ID == ref) {
			return &in
		}
	}
	return nil
}

// Collect removes what no branch needs: branches whose writer died before
// they were complete, removed branches' data, and chunks no durable branch
// uses. Chunks are left alone while a branch is written or read.
func (s Store) Collect() (Removed, error) {
	var rep Removed
	if _, err := os.Stat(s.Dir); errors.Is(err, os.ErrNotExist) {
		return rep, nil
	}
	var errs []error
	entries, _ := os.ReadDir(s.partialDir())
	for _, e := range entries {
		dir := filepath.Join(s.partialDir(), e.Name())
		if writerAlive(dir) {
			continue
		}
		rep.Bytes += treeSize(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Partial = append(rep.Partial, e.Name())
	}
	trash, _ := os.ReadDir(s.trashDir())
	for _, e := range trash {
		dir := filepath.Join(s.trashDir(), e.Name())
		rep.Bytes += treeSize(dir)
		errs = append(errs, os.RemoveAll(dir))
	}
	unlock, ok, err := lockFile(s.storeLock(), unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if !ok {
		rep.ChunksBusy = true
		return rep, errors.Join(errs...)
	}
	defer unlock()
	n, bytes, err := s.collectChunks()
	rep.Chunks, rep.Bytes = n, rep.Bytes+bytes
	return rep, errors.Join(append(errs, err)...)
}

// collectChunks removes the chunks no durable branch lists, and temporary
// files of writers that died. The store must be held whole.
func (s Store) collectChunks() (int, int64, error) {
	used := map[string]bool{}
	infos, err := s.list(false)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the branches before collecting chunks: %w", err)
	}
	for _, in := range infos {
		for _, f := range in.Files {
			for _, c := range f.Chunks {
				used[c.Hash] = true
			}
		}
	}
	var n int
	var bytes int64
	var errs []error
	root := s.chunks().dir
	dirs, _ := os.ReadDir(root)
	for _, d := range dirs {
		files, _ := os.ReadDir(filepath.Join(root, d.Name()))
		for _, f := range files {
			if used[f.Name()] && !strings.HasPrefix(f.Name(), ".tmp-") {
				continue
			}
			path := filepath.Join(root, d.Name(), f.Name())
			st, err := os.Lstat(path)
			if err != nil {
				continue
			}
			if err := os.Remove(path); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
			bytes += st.Size()
		}
	}
	return n, bytes, errors.Join(errs...)
}
