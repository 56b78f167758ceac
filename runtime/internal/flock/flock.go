// Package flock takes exclusive flock(2) locks on files. A lock lasts until
// it is released or its holder dies, whatever kills it.
//
// Whoever holds a lock may unlink its file: `tclone gc` removes the lock
// files no one holds, and a plan's lock goes with its plan. A process that
// was waiting for the lock then gets the lock of an unlinked file, which no
// longer excludes anyone; so Lock checks that the file it holds is still
// the one at its path, and starts over when it is not.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// poll is how often Lock tries again while it waits with a context that
// can end.
const poll = 20 * time.Millisecond

// Lock takes an exclusive lock on the file at path, creating the file (but
// not its directory), and waits for it until ctx ends; a ctx that is already
// done still takes a free lock. A ctx that can never end (Background) waits
// in the kernel, and is woken the moment the lock is free. When the file's
// directory is gone, the error wraps os.ErrNotExist.
func Lock(ctx context.Context, path string) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening lock %s: %w", path, err)
		}
		if err := wait(ctx, f); err != nil {
			f.Close()
			return nil, err
		}
		if isFileAt(f, path) {
			return func() { f.Close() }, nil
		}
		f.Close()
	}
}

// TryLock takes the lock on the existing file at path if no one holds it
// (nor waits for it). ok is false when someone does, or no file is there.
func TryLock(path string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil || !isFileAt(f, path) {
		f.Close()
		return nil, false, nil
	}
	return func() { f.Close() }, true, nil
}

func wait(ctx context.Context, f *os.File) error {
	if ctx.Done() == nil {
		if err := flock(f, unix.LOCK_EX); err != nil {
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		return nil
	}
	for {
		err := flock(f, unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case err != unix.EWOULDBLOCK:
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// flock is flock(2), tried again when a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
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
