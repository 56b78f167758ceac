// Package inheritfd keeps the descriptors a test process inherited from
// whoever started it away from the programs the test starts.
//
// Go marks the files it opens close-on-exec, but not descriptors a process
// was born with. Run under `flock LOCK make test`, the lock's descriptor
// would reach every container, CRIU tree and service a test starts: CRIU
// refuses to dump a tree holding a file lock, and a service started from a
// test would hold the lock for its whole life.
package inheritfd

import (
	"os"
	"strconv"
	"syscall"
)

// CloseOnExec marks every descriptor above stderr close-on-exec.
func CloseOnExec() {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range fds {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
