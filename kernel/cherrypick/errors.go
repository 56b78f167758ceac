package cherrypick

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Refusals and failures of a cherrypick, one per errno the module documents.
// Test them with errors.Is; the underlying unix.Errno matches as well.
var (
	ErrInvalid         = errors.New("malformed request (alignment, length or flags)")
	ErrFault           = errors.New("argument structure not readable or not writable")
	ErrNotPermitted    = errors.New("caller lacks CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the initial user namespace")
	ErrNotPidfd        = errors.New("descriptor is not a pidfd, or the device is not open for writing")
	ErrProcessExited   = errors.New("process has exited, or the source is being reaped by the OOM killer")
	ErrPtraceDenied    = errors.New("ptrace access to the source or destination is denied")
	ErrSameMM          = errors.New("source and destination share one address space")
	ErrNotParked       = errors.New("a thread using the source's or the destination's memory is neither stopped nor frozen")
	ErrUnsupportedArea = errors.New("area cannot be shared (shared, I/O, PFN-mapped, hugetlb, DONTFORK/WIPEONFORK, userfaultfd, special, or the source has uprobes)")
	ErrLayoutMismatch  = errors.New("source and destination areas differ in bounds, protection, protection key, shadow stack, mlock, accounting, kind or file offset")
	ErrNotEmpty        = errors.New("destination area already has memory or page tables of its own")
	ErrInterrupted     = errors.New("interrupted by a fatal signal while waiting for a lock")
	ErrNoMemory        = errors.New("out of memory; the destination is unchanged and the call can be retried")
	ErrNoDescriptor    = errors.New("the caller has no file descriptor left for the snapshot")
)

// errnoErrors maps each documented errno to its error value.
var errnoErrors = map[unix.Errno]error{
	unix.EINVAL:     ErrInvalid,
	unix.EFAULT:     ErrFault,
	unix.EPERM:      ErrNotPermitted,
	unix.EBADF:      ErrNotPidfd,
	unix.ESRCH:      ErrProcessExited,
	unix.EACCES:     ErrPtraceDenied,
	unix.ELOOP:      ErrSameMM,
	unix.EBUSY:      ErrNotParked,
	unix.EOPNOTSUPP: ErrUnsupportedArea,
	unix.ENXIO:      ErrLayoutMismatch,
	unix.EEXIST:     ErrNotEmpty,
	unix.EINTR:      ErrInterrupted,
	unix.ENOMEM:     ErrNoMemory,
	unix.EMFILE:     ErrNoDescriptor,
}

// Errors of the device itself, from Open and Probe.
var (
	ErrNotLoaded    = errors.New("vma_cherrypick module not loaded (" + DevicePath + " missing)")
	ErrIncompatible = errors.New("vma_cherrypick module speaks a different ABI")
)

// OpError describes a failed cherrypick or snapshot of one range.
type OpError struct {
	Op         string // "cherrypick" or "snapshot"
	Start, Len uint64
	Errno      unix.Errno
	// Err is one of the Err* values above, or nil for an undocumented errno.
	Err error
}

func (e *OpError) Error() string {
	reason := e.Errno.Error()
	if e.Err != nil {
		reason = e.Err.Error()
	}
	return fmt.Sprintf("%s [%#x, %#x): %s (%s)", e.Op, e.Start, e.Start+e.Len, reason, unix.ErrnoName(e.Errno))
}

// Unwrap lets errors.Is match both the named error and the errno.
func (e *OpError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Errno}
	}
	return []error{e.Err, e.Errno}
}

func opError(op string, start, length uint64, errno unix.Errno) error {
	return &OpError{Op: op, Start: start, Len: length, Errno: errno, Err: errnoErrors[errno]}
}
