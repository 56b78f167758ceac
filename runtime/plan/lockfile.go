package plan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LocksDir holds tclone's lock files: one per source for its captures, one
// per container for its fork requests. A file is made the first time
// something locks it, and `tclone gc` removes those no one holds
// (CollectLocks); so everything that locks a file here must use Lock,
// which notices a file removed while it waited.
func (s Store) LocksDir() string { return filepath.Join(s.Root, "locks") }

// lockPoll is how often a waiting Lock tries again.
const lockPoll = 20 * time.Millisecond

// Lock takes an exclusive lock on the file at path, creating it, and waits
// for it until ctx ends. The lock is released when unlock is called or the
// process dies.
//
// CollectLocks unlinks a file while holding its lock; a waiter may then get
// the lock of the unlinked file, which no longer excludes anyone. So after
// locking, Lock checks that the file it holds is still the one at path,
// and starts over when it is not.
func Lock(ctx context.Context, path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory: %w", err)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening lock %s: %w", path, err)
		}
		if err := waitFlock(ctx, f); err != nil {
			f.Close()
			return nil, err
		}
		if isFileAt(f, path) {
			return func() { f.Close() }, nil
		}
		f.Close()
	}
}

func waitFlock(ctx context.Context, f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case err == unix.EINTR:
			continue
		case err != unix.EWOULDBLOCK:
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

// isFileAt reports whether the open file f is the file now at path.
func isFileAt(f *os.File, path string) bool {
	var held, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &now) != nil {
		return false
	}
	return held.Dev == now.Dev && held.Ino == now.Ino
}

// CollectLocks removes the lock files no one holds, and returns their
// paths. Each is removed while holding its lock, so no holder loses it; a
// process waiting for it finds it gone and locks a new file (see Lock).
func (s Store) CollectLocks() ([]string, error) {
	entries, err := os.ReadDir(s.LocksDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
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
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // held (or waited for): in use
	}
	if !isFileAt(f, path) {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("removing lock %s: %w", path, err)
	}
	return true, nil
}
