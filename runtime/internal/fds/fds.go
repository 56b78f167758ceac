// Package fds handles the descriptors a process inherits.
package fds

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInherited closes every descriptor above keep that the process
// inherited: those without close-on-exec (the Go runtime's own all have
// it). A helper process started by tclone's caller (conmon, and Podman
// through it) may be passed descriptors, and a pipe end it held could keep
// a reader waiting for its end.
func CloseInherited(keep int) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, ent := range entries {
		fd, err := strconv.Atoi(ent.Name())
		if err != nil || fd <= keep {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
