package branch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/copyfile"
	"github.com/tclone/tclone/runtime/rootfs"
)

// Writer writes one branch. Nothing of it is visible until Commit; Abort,
// or the writer's death, leaves only what Collect removes.
type Writer struct {
	store  Store
	b      Branch
	dir    string
	unlock []func()
}

// partialFile describes a branch being written, for List; failedFile says
// why its writing failed, when its writer could say.
const (
	partialFile = "partial.json"
	failedFile  = "failed"
)

// Begin starts writing a branch called name. It fails at once when a
// branch of that name exists or is being written.
func (s Store) Begin(name string, src Source) (*Writer, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	release, err := s.use()
	if err != nil {
		return nil, err
	}
	w := &Writer{store: s, unlock: []func(){release}}
	w.b = Branch{Version: FormatVersion, ID: newID(), Name: name, CreatedAt: time.Now().UTC(), Source: src}
	if err := s.nameFree(name); err != nil {
		w.Abort()
		return nil, err
	}
	w.dir = filepath.Join(s.partialDir(), w.b.ID)
	if err := os.Mkdir(w.dir, 0o700); err != nil {
		w.Abort()
		return nil, fmt.Errorf("creating branch %s: %w", name, err)
	}
	held, _, err := lockFile(filepath.Join(w.dir, "lock"), unix.LOCK_EX)
	if err != nil {
		w.Abort()
		return nil, err
	}
	w.unlock = append(w.unlock, held)
	if err := atomicfile.WriteJSON(filepath.Join(w.dir, partialFile), &w.b, 0o600); err != nil {
		w.Abort()
		return nil, err
	}
	return w, nil
}

// nameFree fails when name is taken by a branch, durable or being written.
func (s Store) nameFree(name string) error {
	infos, err := s.List()
	if err != nil {
		return err
	}
	for _, in := range infos {
		if in.Name == name {
			return fmt.Errorf("%w: a branch named %s exists (%s, %s, created %s): choose another name, or remove it first (podman container branch rm %s)",
				ErrNameTaken, name, in.ID, in.State, in.CreatedAt.Format(time.RFC3339), name)
		}
	}
	return nil
}

// ID is the branch's ID.
func (w *Writer) ID() string { return w.b.ID }

// Branch is what the writer knows of the branch so far.
func (w *Writer) Branch() Branch { return w.b }

// AddPlan stores every file of the plan in dir as chunks, except its use
// count and lock, which belong to the live plan, and plan.json, which the
// manifest holds (Branch.Plan).
func (w *Writer) AddPlan(ctx context.Context, dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(dir, path)
		switch {
		case d.IsDir():
			return nil
		case rel == "lock" || rel == "uses" || rel == "plan.json":
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("plan %s holds %s, which is not a regular file", dir, rel)
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		chunks, added, err := w.store.chunks().putFile(path)
		if err != nil {
			return err
		}
		w.b.Files = append(w.b.Files, File{Path: rel, Mode: st.Mode().Perm(), Size: st.Size(), Chunks: chunks})
		w.b.Size.Files += st.Size()
		w.b.Size.ChunksAdded += added
		return nil
	})
}

// AddTree keeps directory src in the branch as rel. With move, src (a
// plan's own capture, about to be removed) is moved when it is on the same
// filesystem; else it is copied, with reflinks where the filesystem can.
func (w *Writer) AddTree(ctx context.Context, src, rel string, move bool) error {
	dst := filepath.Join(w.dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	var err error = syscall.EXDEV
	if move {
		err = os.Rename(src, dst)
	}
	if errors.Is(err, syscall.EXDEV) {
		_, err = rootfs.CopyDir(ctx, src, dst)
	}
	if err != nil {
		return fmt.Errorf("keeping %s in branch %s: %w", src, w.b.Name, err)
	}
	w.b.Trees = append(w.b.Trees, rel)
	w.b.Size.Trees += treeSize(dst)
	return nil
}

// AddFile copies file src into the branch as rel.
func (w *Writer) AddFile(src, rel string) error {
	if err := copyfile.Copy(src, filepath.Join(w.dir, rel), newFile); err != nil {
		return fmt.Errorf("keeping %s in branch %s: %w", src, w.b.Name, err)
	}
	return nil
}

// Commit makes the branch visible and durable: its manifest is written,
// everything synced to disk, and it is renamed into place. It fails, and
// leaves nothing, when another branch took its name meanwhile.
func (w *Writer) Commit(fill func(*Branch)) (*Branch, error) {
	fill(&w.b)
	w.b.DurableAt = time.Now().UTC()
	if err := atomicfile.WriteJSON(filepath.Join(w.dir, "branch.json"), &w.b, 0o600); err != nil {
		w.Abort()
		return nil, err
	}
	if err := syncFS(w.dir); err != nil {
		w.Abort()
		return nil, err
	}
	release, err := w.store.naming()
	if err != nil {
		w.Abort()
		return nil, err
	}
	defer release()
	if err := w.store.committedNameFree(w.b.Name); err != nil {
		w.Abort()
		return nil, err
	}
	final := w.store.dirOf(w.b.ID)
	if err := os.Rename(w.dir, final); err != nil {
		w.Abort()
		return nil, fmt.Errorf("committing branch %s: %w", w.b.Name, err)
	}
	w.dir = ""
	os.Remove(filepath.Join(final, partialFile))
	os.Remove(filepath.Join(final, "lock"))
	syncFS(w.store.committedDir())
	w.release()
	b := w.b
	return &b, nil
}

// committedNameFree is nameFree among durable branches only: the writer
// that asks is itself among those being written.
func (s Store) committedNameFree(name string) error {
	if b, err := s.Get(name); err == nil {
		return fmt.Errorf("%w: a branch named %s was made meanwhile (%s): choose another name", ErrNameTaken, name, b.ID)
	}
	return nil
}

// Fail ends the writing, keeping the branch listed as failed, with why,
// until it is removed: for a writer whose caller has gone (create --wait
// runnable). What it wrote goes with it.
func (w *Writer) Fail(why error) {
	if w.dir == "" {
		return
	}
	entries, _ := os.ReadDir(w.dir)
	for _, e := range entries {
		if e.Name() != partialFile && e.Name() != "lock" {
			os.RemoveAll(filepath.Join(w.dir, e.Name()))
		}
	}
	if err := atomicfile.WriteFile(filepath.Join(w.dir, failedFile), []byte(why.Error()), 0o600); err != nil {
		w.Abort()
		return
	}
	w.dir = ""
	w.release()
}

// Abort removes what the writer wrote; the chunks it added that no branch
// uses go at the next Collect.
func (w *Writer) Abort() {
	if w.dir != "" {
		os.RemoveAll(w.dir)
		w.dir = ""
	}
	w.release()
}

func (w *Writer) release() {
	for i := len(w.unlock) - 1; i >= 0; i-- {
		w.unlock[i]()
	}
	w.unlock = nil
}

// syncFS flushes the filesystem that holds dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing %s to disk: %w", dir, err)
	}
	return nil
}

// treeSize is the bytes of the regular files under dir.
func treeSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if st, err := d.Info(); err == nil {
				n += st.Size()
			}
		}
		return nil
	})
	return n
}
