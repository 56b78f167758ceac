// Package wptrack tells which pages of a process's private memory were
// written since they were last looked at, for branches that copy only
// those: a write-protect-async userfaultfd (UFFD_FEATURE_WP_ASYNC, Linux
// 6.7) registered on the process's areas, whose protection the kernel
// clears on a page's first write, read and re-armed in one call with
// PAGEMAP_SCAN on /proc/PID/pagemap. docs/design.md ("Incremental
// branches") has the measurements.
//
// A userfaultfd belongs to the memory of the process that made it, so the
// process must make it (tclone's CRIU plugin does, while CRIU holds it);
// everything else is done from outside, with the descriptor.
package wptrack

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's ABI (include/uapi/linux/userfaultfd.h and fs.h), missing
// from x/sys/unix.
const (
	uffdAPI              = 0xAA
	uffdFeatureWPAsync   = 1 << 15
	uffdioAPI            = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister       = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdioRegisterModeWP = 1 << 1
	uffdUserModeOnly     = 1

	pageIsWritten = 1 << 1
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4

	pmScanWPMatching   = 1 << 0
	pmScanCheckWPAsync = 1 << 1
	pagemapScan        = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)

	pageSize = 4096
)

type uffdioAPIArg struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

type uffdioRegisterArg struct {
	Start, Len uint64
	Mode       uint64
	Ioctls     uint64
}

type pageRegion struct {
	Start, End, Categories uint64
}

type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

// Range is a run of pages, [Start, End).
type Range struct {
	Start, End uint64
}

// Pages is the number of pages in r.
func (r Range) Pages() uint64 { return (r.End - r.Start) / pageSize }

var (
	// ErrForeign: the area is registered with a userfaultfd of someone
	// else's (the process's own): its writes cannot be told.
	ErrForeign = errors.New("the area is registered with another userfaultfd")
	// ErrUntrackable: the kernel does not write-protect this kind of area.
	ErrUntrackable = errors.New("the kernel cannot track writes to this area")
)

// Tracker tracks the writes to one process's memory through a userfaultfd
// made in it.
type Tracker struct {
	uffd    *os.File
	pagemap *os.File
	vec     []pageRegion
}

// New makes a Tracker of process pid with uffd, a userfaultfd that
// process made and that no one has used yet (the UFFDIO_API handshake is
// New's). It fails where the kernel lacks write-protect-async tracking;
// uffd is the Tracker's, closed on failure too.
func New(pid int, uffd *os.File) (*Tracker, error) {
	api := uffdioAPIArg{API: uffdAPI, Features: uffdFeatureWPAsync}
	if err := ioctl(uffd, uffdioAPI, unsafe.Pointer(&api)); err != nil {
		uffd.Close()
		return nil, fmt.Errorf("enabling asynchronous write-protection on the userfaultfd of process %d (Linux 6.7 or later): %w", pid, err)
	}
	return adopt(pid, uffd)
}

// adopt makes a Tracker of process pid with uffd, a userfaultfd of its
// that a Tracker used before (the holder kept it).
func adopt(pid int, uffd *os.File) (*Tracker, error) {
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		uffd.Close()
		return nil, err
	}
	return &Tracker{uffd: uffd, pagemap: pm, vec: make([]pageRegion, 1024)}, nil
}

// Close closes the tracker's descriptors. Once no copy of its userfaultfd
// is left, the kernel unregisters every area and the tracking ends.
func (t *Tracker) Close() {
	t.uffd.Close()
	t.pagemap.Close()
}

// Scan reports the pages of area [start, end) written since its last Scan
// and protects them again, so that the next Scan reports those written
// after this one. An area it has never seen is registered first, and all
// its present and swapped pages are reported: it is tracked from now on.
// The process must not run meanwhile for the answer to hold at one
// instant.
func (t *Tracker) Scan(start, end uint64) ([]Range, error) {
	reg := uffdioRegisterArg{Start: start, Len: end - start, Mode: uffdioRegisterModeWP}
	if err := ioctl(t.uffd, uffdioRegister, unsafe.Pointer(&reg)); err != nil {
		switch {
		case errors.Is(err, unix.EBUSY):
			return nil, ErrForeign
		case errors.Is(err, unix.EINVAL):
			return nil, ErrUntrackable
		}
		return nil, fmt.Errorf("registering %#x-%#x for write tracking: %w", start, end, err)
	}
	var out []Range
	for at := start; at < end; {
		a := pmScanArg{
			Size:   uint64(unsafe.Sizeof(pmScanArg{})),
			Flags:  pmScanWPMatching | pmScanCheckWPAsync,
			Start:  at,
			End:    end,
			Vec:    uint64(uintptr(unsafe.Pointer(&t.vec[0]))),
			VecLen: uint64(len(t.vec)),
			// Written pages that are there (present or swapped out):
			// never a hole, whose protection would install a marker
			// that the process's pagemap then shows as a swapped-out
			// page (to CRIU too), and costs a page table per 2 MiB of
			// address space reserved and never touched.
			CategoryMask:      pageIsWritten,
			CategoryAnyofMask: pageIsPresent | pageIsSwapped,
			ReturnMask:        pageIsWritten,
		}
		n, err := ioctlN(t.pagemap, pagemapScan, unsafe.Pointer(&a))
		if err != nil {
			return nil, fmt.Errorf("reading the writes to %#x-%#x: %w", start, end, err)
		}
		for _, r := range t.vec[:n] {
			if k := len(out); k > 0 && out[k-1].End == r.Start {
				out[k-1].End = r.End
				continue
			}
			out = append(out, Range{r.Start, r.End})
		}
		if a.WalkEnd <= at {
			return nil, fmt.Errorf("reading the writes to %#x-%#x: the scan did not move past %#x", start, end, at)
		}
		at = a.WalkEnd
	}
	return out, nil
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	_, err := ioctlN(f, req, arg)
	return err
}

func ioctlN(f *os.File, req uintptr, arg unsafe.Pointer) (int, error) {
	for {
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(arg))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}

// Userfaultfd makes a userfaultfd for the calling process's own memory, as
// the tracked process must make its own (for tests and for Supported).
func Userfaultfd() (*os.File, error) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("userfaultfd: %w", errno)
	}
	return os.NewFile(fd, "userfaultfd"), nil
}
