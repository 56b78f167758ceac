package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd ABI (include/uapi/linux/userfaultfd.h), x86_64.
const (
	uffdAPI = 0xAA

	uffdioAPI        = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister   = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdioCopy       = 0xc028aa03 // _IOWR(0xAA, 0x03, struct uffdio_copy)
	uffdioZeropage   = 0xc020aa04 // _IOWR(0xAA, 0x04, struct uffdio_zeropage)
	uffdioUnregister = 0x8010aa01 // _IOR(0xAA, 0x01, struct uffdio_range)

	uffdRegisterModeMissing = 1

	uffdEventPagefault = 0x12
	uffdEventFork      = 0x13
	uffdEventRemap     = 0x14
	uffdEventRemove    = 0x15
	uffdEventUnmap     = 0x16

	uffdFeatureEventFork   = 1 << 1
	uffdFeatureEventRemap  = 1 << 2
	uffdFeatureEventRemove = 1 << 3
	uffdFeatureEventUnmap  = 1 << 6

	uffdMsgSize = 32
)

// criuFeatures are the events CRIU asks for when it opens a restored task's
// userfaultfd (NEED_UFFD_API_FEATURES in criu/uffd.c); the daemon handles
// each of them.
const criuFeatures = uffdFeatureEventFork | uffdFeatureEventRemap | uffdFeatureEventRemove | uffdFeatureEventUnmap

// uffdMsg is one struct uffd_msg, decoded.
type uffdMsg struct {
	event uint8
	// pagefault: address; fork: ufd in a; remap: from, to, len in a, b, c;
	// remove and unmap: start, end in a, b.
	address uint64
	a, b, c uint64
}

func decodeMsg(raw []byte) uffdMsg {
	m := uffdMsg{event: raw[0]}
	arg := raw[8:32]
	switch m.event {
	case uffdEventPagefault:
		m.address = binary.LittleEndian.Uint64(arg[8:])
	case uffdEventFork:
		m.a = uint64(binary.LittleEndian.Uint32(arg))
	default:
		m.a = binary.LittleEndian.Uint64(arg)
		m.b = binary.LittleEndian.Uint64(arg[8:])
		m.c = binary.LittleEndian.Uint64(arg[16:])
	}
	return m
}

// uffd is one userfaultfd, opened non-blocking (CRIU opens it so, and the
// descriptors of fork events inherit the flag), which makes it pollable by
// the Go runtime: waiting for a message parks a goroutine, not a thread.
type uffd struct {
	f   *os.File
	raw syscall.RawConn
	buf [64 * uffdMsgSize]byte
}

func newUffd(fd int) (*uffd, error) {
	f := os.NewFile(uintptr(fd), "userfaultfd")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lazy pages: userfaultfd %d: %w", fd, err)
	}
	return &uffd{f: f, raw: raw}, nil
}

func (u *uffd) Close() error { return u.f.Close() }

// read returns the messages pending now, without waiting.
func (u *uffd) read(out []uffdMsg) ([]uffdMsg, error) {
	var n int
	var rerr error
	// Control, not Read: a read must not wait, and must not see the
	// deadline interrupt uses to end a wait.
	err := u.raw.Control(func(fd uintptr) {
		n, rerr = unix.Read(int(fd), u.buf[:])
	})
	if err == nil {
		err = rerr
	}
	if errors.Is(err, unix.EAGAIN) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read userfaultfd: %w", err)
	}
	for i := 0; i+uffdMsgSize <= n; i += uffdMsgSize {
		out = append(out, decodeMsg(u.buf[i:i+uffdMsgSize]))
	}
	return out, nil
}

// wait blocks until a message is pending, d has passed (0: no limit), or
// interrupt is called.
func (u *uffd) wait(d time.Duration) {
	if d > 0 {
		u.f.SetReadDeadline(time.Now().Add(d))
	}
	u.raw.Read(func(fd uintptr) bool {
		var pfd = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
	u.f.SetReadDeadline(time.Time{})
}

// interrupt ends a wait, now or the next time one starts.
func (u *uffd) interrupt() { u.f.SetReadDeadline(time.Unix(1, 0)) }

func (u *uffd) ioctl(req uintptr, arg unsafe.Pointer) error {
	var errno syscall.Errno
	err := u.raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

type uffdioRange struct{ start, len uint64 }

type uffdioCopyArg struct {
	dst, src, len, mode uint64
	copied              int64
}

type uffdioZeropageArg struct {
	rng    uffdioRange
	mode   uint64
	zeroed int64
}

// copy fills dst with src and wakes the threads waiting there. It returns
// how many bytes were filled, also when it fails part way.
func (u *uffd) copy(dst uint64, src []byte) (uint64, error) {
	arg := uffdioCopyArg{dst: dst, src: uint64(uintptr(unsafe.Pointer(&src[0]))), len: uint64(len(src))}
	err := u.ioctl(uffdioCopy, unsafe.Pointer(&arg))
	runtime.KeepAlive(src)
	if arg.copied > 0 {
		return uint64(arg.copied), err
	}
	return 0, err
}

type uffdioRegisterArg struct {
	rng    uffdioRange
	mode   uint64
	ioctls uint64
}

// unregister stops handling faults in [start, end), which must be whole
// VMAs (CRIU registered them whole).
func (u *uffd) unregister(start, end uint64) error {
	arg := uffdioRange{start, end - start}
	return u.ioctl(uffdioUnregister, unsafe.Pointer(&arg))
}

// register handles missing-page faults in [start, end) again, as CRIU's
// restorer registered it.
func (u *uffd) register(start, end uint64) error {
	arg := uffdioRegisterArg{rng: uffdioRange{start, end - start}, mode: uffdRegisterModeMissing}
	return u.ioctl(uffdioRegister, unsafe.Pointer(&arg))
}

// zero maps the zero page at [dst, dst+n): pages the dump did not have.
func (u *uffd) zero(dst, n uint64) error {
	arg := uffdioZeropageArg{rng: uffdioRange{dst, n}}
	return u.ioctl(uffdioZeropage, unsafe.Pointer(&arg))
}
