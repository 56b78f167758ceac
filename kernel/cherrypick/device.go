package cherrypick

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Version is what the module reports about itself.
type Version struct {
	ABI      uint32
	ArgsSize uint32
	Features Features
}

// Has reports whether every bit of f is supported.
func (v Version) Has(f Features) bool { return v.Features&f == f }

// Result counts what one cherrypick shared.
type Result struct {
	Areas       uint64 // areas (VMAs) processed
	AnonPages   uint64 // resident anonymous base pages now shared
	SwapEntries uint64 // swapped-out anonymous pages now shared
}

// Device is an open handle on the module's misc device.
type Device struct {
	f       *os.File
	version Version
}

// Open opens DevicePath and checks that the module speaks this ABI.
func Open() (*Device, error) { return OpenPath(DevicePath) }

// OpenPath is Open for a device node at another path.
func OpenPath(path string) (*Device, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open %s: %w; load it with 'modprobe vma_cherrypick' (see kernel/vma_cherrypick/README.md)", path, ErrNotLoaded)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	d := &Device{f: f}
	v, err := d.queryVersion()
	if err != nil {
		f.Close()
		return nil, err
	}
	if v.ABI != ABIVersion || uintptr(v.ArgsSize) < unsafe.Sizeof(cherrypickArgs{}) {
		f.Close()
		return nil, fmt.Errorf("%s: module ABI %d (argument size %d), these bindings need ABI %d (size %d): %w",
			path, v.ABI, v.ArgsSize, ABIVersion, unsafe.Sizeof(cherrypickArgs{}), ErrIncompatible)
	}
	d.version = v
	return d, nil
}

// Probe answers "is the module present and compatible" and returns its
// version. It only opens the device and asks for the version, which changes
// nothing in the kernel.
func Probe() (Version, error) {
	d, err := Open()
	if err != nil {
		return Version{}, err
	}
	defer d.Close()
	return d.Version(), nil
}

// Version returns what the module reported when the device was opened.
func (d *Device) Version() Version { return d.version }

// Close closes the device.
func (d *Device) Close() error { return d.f.Close() }

func (d *Device) queryVersion() (Version, error) {
	var v versionArgs
	if err := d.ioctl(iocVersion, unsafe.Pointer(&v)); err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
			return Version{}, fmt.Errorf("%s is not a vma_cherrypick device (%v): %w", d.f.Name(), err, ErrIncompatible)
		}
		return Version{}, fmt.Errorf("query version of %s: %w", d.f.Name(), err)
	}
	return Version{ABI: v.ABIVersion, ArgsSize: v.ArgsSize, Features: Features(v.Features)}, nil
}

// Cherrypick maps [start, start+length) of the destination onto the pages
// of the same range in the source, copy-on-write. srcPidfd and dstPidfd are
// pidfds (pidfd_open(2)); every thread of both must be stopped or frozen. On failure the error is an *OpError that matches one of the Err*
// values with errors.Is.
func (d *Device) Cherrypick(srcPidfd, dstPidfd int, start, length uint64) (Result, error) {
	return d.cherrypick(cherrypickArgs{SrcPidfd: int32(srcPidfd), DstPidfd: int32(dstPidfd), Start: start, Len: length})
}

// CherrypickFrom is Cherrypick with a snapshot as the source: the
// destination gets the pages the source had when the snapshot was taken.
// Only the destination needs to be stopped or frozen.
func (d *Device) CherrypickFrom(snap *Snapshot, dstPidfd int, start, length uint64) (Result, error) {
	if !d.version.Has(FeatureSnapshot) {
		return Result{}, fmt.Errorf("cherrypick from a snapshot: the loaded module (features %#x) has no snapshots; load this version of vma_cherrypick: %w", uint64(d.version.Features), ErrIncompatible)
	}
	conn, err := snap.f.SyscallConn()
	if err != nil {
		return Result{}, err
	}
	var res Result
	var opErr error
	if err := conn.Control(func(fd uintptr) {
		res, opErr = d.cherrypick(cherrypickArgs{SrcPidfd: int32(fd), DstPidfd: int32(dstPidfd), Start: start, Len: length, Flags: flagSrcSnapshot})
	}); err != nil {
		return Result{}, err
	}
	return res, opErr
}

func (d *Device) cherrypick(args cherrypickArgs) (Result, error) {
	if err := d.ioctl(iocCherrypick, unsafe.Pointer(&args)); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return Result{}, opError("cherrypick", args.Start, args.Len, errno)
		}
		return Result{}, err
	}
	return Result{Areas: args.Areas, AnonPages: args.AnonPages, SwapEntries: args.SwapEntries}, nil
}

func (d *Device) ioctl(req uintptr, arg unsafe.Pointer) error {
	conn, err := d.f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
