package procfs

import (
	"time"

	"golang.org/x/sys/unix"
)

// PidfdExited waits up to limit for the process of pidfd fd to exit, and
// says whether it did: a pidfd polls readable once its process has exited,
// reaped or not. A negative limit waits without one. A poll that fails
// (other than by EINTR) ends the wait with its error.
func PidfdExited(fd int, limit time.Duration) (bool, error) {
	deadline := time.Now().Add(limit)
	for {
		timeout := -1
		if limit >= 0 {
			timeout = int(min(max(time.Until(deadline), 0), 100*time.Millisecond) / time.Millisecond)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, timeout)
		switch {
		case err == unix.EINTR:
		case err != nil:
			return false, err
		case n > 0:
			return true, nil
		}
		if limit >= 0 && !time.Now().Before(deadline) {
			return false, nil
		}
	}
}
