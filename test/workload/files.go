package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Names of the files serve keeps in its state directory.
const (
	offsetFileName   = "offset.txt"
	deletedFileName  = "deleted.txt"
	flockFileName    = "lock"
	posixLockName    = "posixlock"
	counterFileName  = "counter"
	readyFileName    = "ready"
	mutationsLogName = "mutations.log"
)

// The offset file is written in full, then its fd is left positioned in
// the middle, where only a restore that keeps file positions finds it.
const (
	offsetFileSize = 100
	offsetFilePos  = 37
)

// The POSIX lock covers bytes 0 to 10 inclusive.
const (
	posixLockStart = 0
	posixLockLen   = 11
)

// randomHex returns n random bytes in hex. The values only need to be
// unpredictable between runs, not secret. math/rand/v2 is used rather than
// crypto/rand because on Linux >= 6.11 crypto/rand goes through the vDSO
// getrandom, whose per-thread state lives in MAP_DROPPABLE mappings: a
// memory kind these tests are not about and which older CRIU cannot dump.
func randomHex(n int) string {
	b := make([]byte, 0, n+7)
	for len(b) < n {
		b = binary.LittleEndian.AppendUint64(b, rand.Uint64())
	}
	return hex.EncodeToString(b[:n])
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// openFiles holds the regular files serve keeps open. The *os.File values
// live as long as serve, so their finalizers never close the fds.
type openFiles struct {
	offset      *os.File
	deleted     *os.File
	deletedPath string
	deletedSum  string // sha256 of what was written before the unlink
}

// openOffsetFile creates offset.txt with offsetFileSize bytes and leaves
// the fd at offsetFilePos.
func openOffsetFile(dir string) (*os.File, error) {
	path := filepath.Join(dir, offsetFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	content := []byte(strings.Repeat("0123456789", offsetFileSize/10))
	if _, err := f.Write(content); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Seek(offsetFilePos, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("seek %s: %w", path, err)
	}
	return f, nil
}

// openDeletedFile creates deleted.txt with random content, unlinks it and
// returns the still open file and the sha256 of its content.
func openDeletedFile(dir string) (*os.File, string, error) {
	path := filepath.Join(dir, deletedFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, "", err
	}
	content := []byte("workload deleted file " + randomHex(32) + "\n")
	if _, err := f.Write(content); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("unlink %s: %w", path, err)
	}
	return f, sha256Hex(content), nil
}

// readAllAt reads a file's whole content with pread, leaving its offset
// alone.
func readAllAt(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b, nil
}

// heldLocks are the fds through which serve holds its locks. They are raw
// fds on purpose: a POSIX lock goes away when the process closes any fd of
// the file, so nothing else in serve may ever open these files.
type heldLocks struct {
	flockFD, posixFD int
}

// takeLocks takes an exclusive flock on lock and a POSIX write lock on the
// start of posixlock. Both are non-blocking: if another serve holds them,
// it uses the same state directory, and starting would only confuse both.
func takeLocks(dir string) (*heldLocks, error) {
	flockPath := filepath.Join(dir, flockFileName)
	ffd, err := unix.Open(flockPath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", flockPath, err)
	}
	if err := unix.Flock(ffd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(ffd)
		return nil, fmt.Errorf("flock %s (is another serve using %s?): %w", flockPath, dir, err)
	}
	posixPath := filepath.Join(dir, posixLockName)
	pfd, err := unix.Open(posixPath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		unix.Close(ffd)
		return nil, fmt.Errorf("open %s: %w", posixPath, err)
	}
	lk := posixLockRange(unix.F_WRLCK)
	if err := unix.FcntlFlock(uintptr(pfd), unix.F_SETLK, &lk); err != nil {
		unix.Close(ffd)
		unix.Close(pfd)
		return nil, fmt.Errorf("lock bytes %d-%d of %s: %w", posixLockStart, posixLockStart+posixLockLen-1, posixPath, err)
	}
	return &heldLocks{flockFD: ffd, posixFD: pfd}, nil
}

func posixLockRange(typ int16) unix.Flock_t {
	return unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: posixLockStart, Len: posixLockLen}
}

// checkFlock tries to take the flock on path from this process. It must
// be run by another process than the holder; true means the lock is held.
func checkFlock(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	switch err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		unix.Flock(fd, unix.LOCK_UN)
		return false, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	default:
		return false, fmt.Errorf("flock %s: %w", path, err)
	}
}

// checkPosixLock asks the kernel (F_GETLK) who holds a lock conflicting
// with a write lock on serve's range. It must be run by another process
// than the holder, whose own locks never conflict. It returns the holder's
// pid, as seen in the caller's pid namespace, or 0 if nobody holds it.
func checkPosixLock(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	// Closing drops this process's POSIX locks on the file; it holds none.
	defer unix.Close(fd)
	lk := posixLockRange(unix.F_WRLCK)
	if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil {
		return 0, fmt.Errorf("F_GETLK %s: %w", path, err)
	}
	if lk.Type == unix.F_UNLCK {
		return 0, nil
	}
	return int(lk.Pid), nil
}

// writeFileAtomic replaces path with data so that readers see either the
// old or the new content, never a truncated file.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readCounterFile reads the number serve last wrote to the counter file.
func readCounterFile(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// appendLine appends one line to path, creating it if needed.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
