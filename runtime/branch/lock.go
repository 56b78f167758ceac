package branch

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lockFile takes a flock(2) lock of kind how (LOCK_SH, LOCK_EX, with
// LOCK_NB not to wait) on path, creating it. ok is false when LOCK_NB was
// given and someone holds it. The files locked here are never removed
// while anyone may lock them: the store's own, or a partial branch's, which
// goes only with its directory once its lock was free.
func lockFile(path string, how int) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, true, nil
}

func (s Store) storeLock() string { return filepath.Join(s.Dir, "lock") }
func (s Store) namesLock() string { return filepath.Join(s.Dir, "names.lock") }

// use holds the store shared: chunks are not collected meanwhile.
func (s Store) use() (func(), error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	unlock, _, err := lockFile(s.storeLock(), unix.LOCK_SH)
	return unlock, err
}

// naming holds the names of the store still.
func (s Store) naming() (func(), error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	unlock, _, err := lockFile(s.namesLock(), unix.LOCK_EX)
	return unlock, err
}
