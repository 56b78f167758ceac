package cherrypick

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Snapshot is a copy-on-write copy of a stopped process's private
// anonymous memory, held by a file descriptor: what fork() gives a child,
// without the child. It is the source of later cherrypicks
// (Device.CherrypickFrom); its pages are freed when it is closed.
type Snapshot struct {
	f *os.File
	// SnapshotResult counts what it took.
	SnapshotResult
}

// SnapshotResult counts what one snapshot took.
type SnapshotResult struct {
	Areas       uint64 // areas (VMAs) taken
	Skipped     uint64 // areas of the range a snapshot cannot hold (file, shared, special, mlocked, ...)
	AnonPages   uint64 // resident anonymous base pages held
	SwapEntries uint64 // swapped-out anonymous pages held
}

// File is the snapshot's descriptor, to pass to another process (its
// memory lives as long as any copy of it).
func (s *Snapshot) File() *os.File { return s.f }

// Close releases the snapshot's hold on its pages.
func (s *Snapshot) Close() error { return s.f.Close() }

// Snapshot takes a snapshot of the private anonymous areas of
// [start, start+length) of a stopped or frozen source (a pidfd). Other
// kinds of area in the range are skipped and counted. On failure the error
// is an *OpError that matches one of the Err* values with errors.Is.
func (d *Device) Snapshot(srcPidfd int, start, length uint64) (*Snapshot, error) {
	if !d.version.Has(FeatureSnapshot) {
		return nil, fmt.Errorf("snapshot: the loaded module (features %#x) has no snapshots; load this version of vma_cherrypick: %w", uint64(d.version.Features), ErrIncompatible)
	}
	args := snapshotArgs{SrcPidfd: int32(srcPidfd), Start: start, Len: length, Fd: -1}
	if err := d.ioctl(iocSnapshot, unsafe.Pointer(&args)); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return nil, opError("snapshot", start, length, errno)
		}
		return nil, err
	}
	return &Snapshot{
		f: os.NewFile(uintptr(args.Fd), "vma_cherrypick-snapshot"),
		SnapshotResult: SnapshotResult{
			Areas: args.Areas, Skipped: args.Skipped,
			AnonPages: args.AnonPages, SwapEntries: args.SwapEntries,
		},
	}, nil
}

// SnapshotFile is a snapshot's descriptor that came from elsewhere (the
// process that took it passed it on), as a Snapshot; its counts are zero.
func SnapshotFile(f *os.File) *Snapshot { return &Snapshot{f: f} }
