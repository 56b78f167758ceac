// Package fds handles the descriptors a process inherits, and the start
// of tclone's helper processes (the binary re-executed under a hidden
// command).
package fds

import (
	"encoding/json"
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

// HelperArgs reports whether argv asks for the helper command, and decodes
// its configuration (argv[2], JSON) into cfg; a configuration that does not
// decode exits with status 2. It then closes the descriptors the helper
// inherited above keep.
func HelperArgs(command string, cfg any, keep int) bool {
	return HelperArgsKeeping(command, cfg, func() int { return keep })
}

// HelperArgsKeeping is HelperArgs for a helper passed descriptors of its
// own from 3 on, as many as its configuration says: keep is asked once
// the configuration is decoded.
func HelperArgsKeeping(command string, cfg any, keep func() int) bool {
	if len(os.Args) < 3 || os.Args[1] != command {
		return false
	}
	if err := json.Unmarshal([]byte(os.Args[2]), cfg); err != nil {
		os.Exit(2)
	}
	CloseInherited(keep())
	return true
}
