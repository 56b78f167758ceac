package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A minimal FUSE file system with one regular file, "f", whose reads are
// held unanswered until release(). A page fault on a mapping of that file
// then blocks in the kernel for as long as the test wants, and a fault made
// on another process's behalf (a read of /proc/PID/mem) blocks holding that
// process's mmap lock: the "lock held by someone else, forever" case.

const (
	fuseLookup  = 1
	fuseForget  = 2
	fuseGetattr = 3
	fuseOpen    = 14
	fuseRead    = 15
	fuseRelease = 18
	fuseFlush   = 25
	fuseInit    = 26
	fuseIntr    = 36
	fuseDestroy = 38
	fuseBatchFg = 42

	fuseFileSize = 4 * mib
)

type fuseServer struct {
	dev  int // /dev/fuse; raw, as Go's poller refuses it
	mnt  string
	mu   sync.Mutex
	held [][2]uint64 // unique, size of unanswered reads
	open bool        // reads are answered at once after release
	read chan struct{}
	done chan struct{}
}

func startFUSE(mnt string) (*fuseServer, error) {
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	dev, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/fuse: %w", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", dev)
	if err := unix.Mount("vcpfuse", mnt, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(dev)
		return nil, fmt.Errorf("mount fuse on %s: %w", mnt, err)
	}
	f := &fuseServer{dev: dev, mnt: mnt, read: make(chan struct{}, 1), done: make(chan struct{})}
	go f.serve()
	return f, nil
}

// waitRead waits until a read of the file is being held.
func (f *fuseServer) waitRead(timeout time.Duration) error {
	select {
	case <-f.read:
		return nil
	case <-time.After(slow(timeout)):
		return fmt.Errorf("no read reached the FUSE file within %v", timeout)
	}
}

// release answers every held read (with zeroes) and all later ones at once.
func (f *fuseServer) release() {
	f.mu.Lock()
	f.open = true
	held := f.held
	f.held = nil
	f.mu.Unlock()
	for _, r := range held {
		f.reply(r[0], 0, make([]byte, r[1]))
	}
}

func (f *fuseServer) stop() {
	f.release()
	unix.Unmount(f.mnt, unix.MNT_DETACH)
	unix.Close(f.dev)
	<-f.done
}

func (f *fuseServer) reply(unique uint64, errno int32, payload []byte) {
	out := make([]byte, 16+len(payload))
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
	binary.LittleEndian.PutUint32(out[4:], uint32(-errno))
	binary.LittleEndian.PutUint64(out[8:], unique)
	copy(out[16:], payload)
	unix.Write(f.dev, out) // fails only once the mount is gone
}

func (f *fuseServer) serve() {
	defer close(f.done)
	buf := make([]byte, 1<<20+4096)
	for {
		n, err := unix.Read(f.dev, buf)
		if err != nil {
			if err == unix.EINTR || err == unix.ENOENT {
				continue
			}
			return
		}
		if n < 40 {
			continue
		}
		f.handle(buf[:n])
	}
}

// fuseAttr is struct fuse_attr (88 bytes) for the root (1) or the file (2).
func fuseAttr(node uint64) []byte {
	a := make([]byte, 88)
	le := binary.LittleEndian
	le.PutUint64(a[0:], node) // ino
	mode, nlink, size := uint32(unix.S_IFDIR|0o755), uint32(2), uint64(0)
	if node == 2 {
		mode, nlink, size = unix.S_IFREG|0o644, 1, fuseFileSize
	}
	le.PutUint64(a[8:], size)
	le.PutUint64(a[16:], size/512)
	le.PutUint32(a[60:], mode)
	le.PutUint32(a[64:], nlink)
	le.PutUint32(a[80:], 4096) // blksize
	return a
}

func (f *fuseServer) handle(req []byte) {
	le := binary.LittleEndian
	op, unique, node := le.Uint32(req[4:]), le.Uint64(req[8:]), le.Uint64(req[16:])
	body := req[40:]
	switch op {
	case fuseInit:
		out := make([]byte, 64) // struct fuse_init_out
		le.PutUint32(out[0:], 7)
		le.PutUint32(out[4:], 31)
		le.PutUint32(out[8:], le.Uint32(body[8:])) // max_readahead as offered
		le.PutUint16(out[16:], 16)                 // max_background
		le.PutUint16(out[18:], 12)                 // congestion_threshold
		le.PutUint32(out[20:], 128*1024)           // max_write
		le.PutUint32(out[24:], 1)                  // time_gran
		le.PutUint16(out[28:], 32)                 // max_pages
		f.reply(unique, 0, out)
	case fuseLookup:
		if string(body[:len(body)-1]) != "f" {
			f.reply(unique, int32(unix.ENOENT), nil)
			return
		}
		out := make([]byte, 40, 128) // struct fuse_entry_out
		le.PutUint64(out[0:], 2)
		le.PutUint64(out[16:], 3600) // entry_valid
		le.PutUint64(out[24:], 3600) // attr_valid
		f.reply(unique, 0, append(out, fuseAttr(2)...))
	case fuseGetattr:
		out := make([]byte, 16, 104) // struct fuse_attr_out
		le.PutUint64(out[0:], 3600)
		f.reply(unique, 0, append(out, fuseAttr(node)...))
	case fuseOpen:
		f.reply(unique, 0, make([]byte, 16)) // struct fuse_open_out
	case fuseRead:
		size := uint64(le.Uint32(body[16:]))
		f.mu.Lock()
		if f.open {
			f.mu.Unlock()
			f.reply(unique, 0, make([]byte, size))
			return
		}
		f.held = append(f.held, [2]uint64{unique, size})
		f.mu.Unlock()
		select {
		case f.read <- struct{}{}:
		default:
		}
	case fuseRelease, fuseFlush:
		f.reply(unique, 0, nil)
	case fuseForget, fuseBatchFg, fuseIntr, fuseDestroy:
		// no reply expected
	default:
		f.reply(unique, int32(unix.ENOSYS), nil)
	}
}
