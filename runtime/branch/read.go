package branch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Get finds a durable branch by name or ID.
func (s Store) Get(ref string) (*Branch, error) {
	if idRE.MatchString(ref) {
		b, err := readManifest(s.manifestOf(ref))
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	infos, err := s.list(false)
	if err != nil {
		return nil, err
	}
	for _, in := range infos {
		if in.Name == ref {
			return in.Branch, nil
		}
	}
	return nil, fmt.Errorf("%w %q: list them with podman container branch ls", ErrNotFound, ref)
}

// List returns every branch, durable or being written, oldest first.
func (s Store) List() ([]Info, error) { return s.list(true) }

// ListOf returns the branches of source (see Source.Is).
func (s Store) ListOf(source string) ([]Info, error) {
	infos, err := s.list(true)
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, in := range infos {
		if in.Source.Is(source) {
			out = append(out, in)
		}
	}
	return out, nil
}

func (s Store) list(writing bool) ([]Info, error) {
	var out []Info
	entries, err := os.ReadDir(s.committedDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		b, err := readManifest(filepath.Join(s.committedDir(), e.Name(), "branch.json"))
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, Info{Branch: b, State: StateDurable})
	}
	if writing {
		partial, err := s.partials()
		if err != nil {
			return nil, err
		}
		out = append(out, partial...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// partials are the branches whose writer still runs (it holds their lock),
// and those whose writer recorded its failure.
func (s Store) partials() ([]Info, error) {
	entries, err := os.ReadDir(s.partialDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []Info
	for _, e := range entries {
		dir := filepath.Join(s.partialDir(), e.Name())
		in := Info{State: StateWriting}
		if !writerAlive(dir) {
			why, err := os.ReadFile(filepath.Join(dir, failedFile))
			if err != nil {
				continue // a writer that died: nothing to show
			}
			in.State, in.Error = StateFailed, string(why)
		}
		b, err := readManifest(filepath.Join(dir, partialFile))
		if err != nil {
			continue // being set up, or gone meanwhile
		}
		in.Branch = b
		out = append(out, in)
	}
	return out, nil
}

// WaitDurable waits until branch ref (a name or ID), being written, is
// durable. It fails at once for a branch that failed or does not exist.
func (s Store) WaitDurable(ctx context.Context, ref string) error {
	for {
		if _, err := s.Get(ref); err == nil {
			return nil
		}
		infos, err := s.partials()
		if err != nil {
			return err
		}
		i := slices.IndexFunc(infos, func(in Info) bool { return in.Name == ref || in.ID == ref })
		switch {
		case i < 0:
			// Committed since the Get, or never there.
			_, err := s.Get(ref)
			return err
		case infos[i].State == StateFailed:
			return fmt.Errorf("branch %s failed while it was written: %s; remove it (podman container branch rm %s) and create it again", ref, infos[i].Error, ref)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for branch %s to be written: %w", ref, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writerAlive reports whether the writer of the partial branch in dir
// holds its lock.
func writerAlive(dir string) bool {
	path := filepath.Join(dir, "lock")
	if _, err := os.Stat(path); err != nil {
		// Its writer made the directory and died before the lock.
		return false
	}
	unlock, ok, err := lockFile(path, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return true // cannot tell: leave it
	}
	if ok {
		unlock()
		return false
	}
	return true
}

// Reader reads a branch back; the store's chunks are not collected while
// it is open.
type Reader struct {
	store   Store
	b       *Branch
	release func()
}

// Open finds branch ref and holds the store for reading it.
func (s Store) Open(ref string) (*Reader, error) {
	release, err := s.use()
	if err != nil {
		return nil, err
	}
	b, err := s.Get(ref)
	if err != nil {
		release()
		return nil, err
	}
	return &Reader{store: s, b: b, release: release}, nil
}

// Branch is the manifest of the branch being read.
func (r *Reader) Branch() *Branch { return r.b }

// Path is where the branch keeps rel.
func (r *Reader) Path(rel string) string { return r.store.Path(r.b, rel) }

// Close lets the store's chunks be collected again.
func (r *Reader) Close() {
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// WritePlan writes the branch's plan files but plan.json (Branch.Plan) into dir, checking every chunk
// against its hash. A corrupt or missing chunk fails with ErrCorrupt,
// naming it and the file it belongs to.
//
// The manifest is checked first (a branch imported by an older tclone was
// not): every file's path must stay inside dir.
func (r *Reader) WritePlan(dir string) error {
	if _, err := checkFiles(r.b.Files); err != nil {
		return fmt.Errorf("branch %s cannot be started: %w; remove it (podman container branch rm %s)", r.b.Name, err, r.b.Name)
	}
	for _, f := range r.b.Files {
		path := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		if _, err := os.Stat(r.store.dirOf(r.b.ID)); err != nil {
			return fmt.Errorf("branch %s was removed while it was being read", r.b.Name)
		}
		if err := r.store.chunks().getFile(path, f.Mode, f.Chunks); err != nil {
			if errors.Is(err, ErrCorrupt) {
				return fmt.Errorf("branch %s, file %s: %w; the branch cannot be started: remove it (podman container branch rm %s)", r.b.Name, f.Path, err, r.b.Name)
			}
			return fmt.Errorf("branch %s, file %s: %w", r.b.Name, f.Path, err)
		}
	}
	return nil
}

// ErrNoFile is a file the branch does not have.
var ErrNoFile = errors.New("no such file in the branch")

// WriteFile writes the branch's file rel (its path in the plan directory)
// to dst, which must not exist, checking every chunk against its hash.
func (r *Reader) WriteFile(rel, dst string) error {
	for _, f := range r.b.Files {
		if f.Path != rel {
			continue
		}
		if err := r.store.chunks().getFile(dst, f.Mode, f.Chunks); err != nil {
			return fmt.Errorf("branch %s, file %s: %w", r.b.Name, rel, err)
		}
		return nil
	}
	return fmt.Errorf("branch %s: %w: %s", r.b.Name, ErrNoFile, rel)
}

// FileReader reads one of a branch's files where it lies, chunk by chunk,
// each checked against its hash as it is decoded; it keeps the last chunk
// it decoded, so that reading in order decodes each once.
type FileReader struct {
	store   chunkStore
	chunks  []Chunk
	offsets []int64
	size    int64

	mu   sync.Mutex
	last int
	data []byte
}

// OpenFile returns a reader of the branch's file rel (its path in the plan
// directory).
func (r *Reader) OpenFile(rel string) (*FileReader, error) {
	for _, f := range r.b.Files {
		if f.Path != rel {
			continue
		}
		fr := &FileReader{store: r.store.chunks(), chunks: f.Chunks, offsets: make([]int64, len(f.Chunks)), last: -1}
		for i, ch := range f.Chunks {
			fr.offsets[i] = fr.size
			fr.size += ch.Size
		}
		return fr, nil
	}
	return nil, fmt.Errorf("branch %s: %w: %s", r.b.Name, ErrNoFile, rel)
}

// Size is the file's size.
func (f *FileReader) Size() int64 { return f.size }

// ReadAt reads len(p) bytes at off (io.ReaderAt).
func (f *FileReader) ReadAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for n < len(p) {
		at := off + int64(n)
		if at >= f.size {
			return n, io.EOF
		}
		i := sort.Search(len(f.offsets), func(i int) bool { return f.offsets[i] > at }) - 1
		if i != f.last {
			data, err := f.store.get(f.chunks[i])
			if err != nil {
				return n, err
			}
			f.last, f.data = i, data
		}
		n += copy(p[n:], f.data[at-f.offsets[i]:])
	}
	return n, nil
}
