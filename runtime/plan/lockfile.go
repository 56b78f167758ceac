package plan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tclone/tclone/runtime/internal/flock"
)

// Lock takes an exclusive lock on the file at path, creating it and its
// directory, and waits for it until ctx ends. The lock is released when
// unlock is called or the process dies. A lock file that CollectLocks
// removes while a process waits for it is locked anew (see flock).
func Lock(ctx context.Context, path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory: %w", err)
	}
	return flock.Lock(ctx, path)
}

// CollectLocks removes the lock files no one holds, and returns their
// paths. Each is removed while holding its lock, so no holder loses it; a
// process waiting for it finds it gone and locks a new file (see Lock).
func (s Store) CollectLocks() ([]string, error) {
	entries, err := readDir(s.LocksDir())
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ent := range entries {
		if !ent.Type().IsRegular() || !strings.HasSuffix(ent.Name(), ".lock") {
			continue
		}
		path := filepath.Join(s.LocksDir(), ent.Name())
		ok, err := removeUnheldLock(path)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// removeUnheldLock unlinks the lock file at path if no one holds it.
func removeUnheldLock(path string) (bool, error) {
	unlock, free, err := flock.TryLock(path)
	if !free {
		return false, err // held (or waited for): in use; or gone
	}
	defer unlock()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("removing lock %s: %w", path, err)
	}
	return true, nil
}
