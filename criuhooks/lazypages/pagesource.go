package lazypages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pageSource is where a task's missing pages come from.
type pageSource interface {
	// at returns n bytes of data at off: a slice of a mapping, or *buf
	// filled by a read (grown first if it is too small). Only a source
	// that reads touches *buf, so that a mapping costs no buffer.
	at(buf *[]byte, n, off uint64) ([]byte, error)
}

// mappedPages is a pages image mapped read-only; spans point into it.
type mappedPages []byte

func (m mappedPages) at(_ *[]byte, n, off uint64) ([]byte, error) {
	return m[off : off+n], nil
}

// snapshotPages is a vma_cherrypick snapshot of the task's memory, read
// with pread at the pages' own addresses (spans point at those).
type snapshotPages struct{ f *os.File }

func (s snapshotPages) at(bufp *[]byte, n, off uint64) ([]byte, error) {
	if uint64(cap(*bufp)) < n {
		*bufp = make([]byte, max(n, minChunk))
	}
	buf := (*bufp)[:n]
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
