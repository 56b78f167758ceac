package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
)

// Name is the entry's file name in its journal, by which a keeper process
// adopts it (Adopt).
func (e *Entry) Name() string { return filepath.Base(e.path) }

// Adopt claims one entry for the calling process once its owner has died,
// the way Orphans claims every orphan: a keeper that watched the owner
// undoes the operation itself, and no other recovery touches it meanwhile.
// It returns nil, nil when the entry is gone (its operation finished, or
// another recovery claimed it first).
func (j Journal) Adopt(name string) (*Entry, error) {
	path := filepath.Join(j.Dir, name)
	var rec Record
	err := atomicfile.ReadJSON(path, &rec)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading journal entry: %w", err)
	}
	// A keeper learns of its owner's death when the owner's files close,
	// a moment before the owner is a zombie, and until its parent reaps it
	// the zombie looks alive to Owner.Alive.
	if !waitGone(rec.Owner, adoptWait) {
		return nil, fmt.Errorf("journal entry %s: its owner (pid %d) still runs; only an orphan can be adopted", path, rec.Owner.Pid)
	}
	claim := ClaimedBy(path, Self())
	if err := os.Rename(path, claim); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("claiming journal entry %s: %w", path, err)
	}
	return &Entry{path: claim, Rec: rec}, nil
}

// adoptWait bounds how long Adopt waits for the owner to finish exiting.
var adoptWait = 5 * time.Second

// waitGone waits until o has exited (a zombie counts as exited), or for
// timeout, and reports whether it has.
func waitGone(o Owner, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !o.Running() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
