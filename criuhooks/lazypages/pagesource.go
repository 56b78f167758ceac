package lazypages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pageSource is where a task's missing pages come from.
type pageSource interface {
	// at returns len(buf) bytes of data at off: a slice of a mapping, or
	// buf filled by a read.
	at(buf []byte, off uint64) ([]byte, error)
}

// mappedPages is a pages image mapped read-only; spans point into it.
type mappedPages []byte

func (m mappedPages) at(buf []byte, off uint64) ([]byte, error) {
	return m[off : off+uint64(len(buf))], nil
}

// snapshotPages is a vma_cherrypick snapshot of the task's memory, read
// with pread at the pages' own addresses (spans point at those).
type snapshotPages struct{ f *os.File }

func (s snapshotPages) at(buf []byte, off uint64) ([]byte, error) {
	for done := 0; done < len(buf); {
		n, err := unix.Pread(int(s.f.Fd()), buf[done:], int64(off)+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot read at %#x: %w", off+uint64(done), err)
		}
		if n == 0 {
			return nil, fmt.Errorf("snapshot read at %#x: nothing there", off+uint64(done))
		}
		done += n
	}
	return buf, nil
}
