package lazypages

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Filling reports whether the task pid still has memory registered with a
// userfaultfd in missing mode ("um" in its smaps VmFlags): a lazily restored
// task its daemon has not finished.
//
// Such a task must not be dumped. CRIU dumps only the pages that are
// present, so every page still missing would be left out of the dump, and a
// sibling restored from it would read zeros there. A fork of a sibling waits
// until none of its tasks is filling (or refuses). The kernel, not the
// daemon, answers: the daemon closes a task's userfaultfd when it is done,
// which unregisters its areas.
//
// A task that holds a userfaultfd itself (one its own program made) is not
// filling from a daemon, however its areas are registered: no daemon will
// ever finish them, so a fork must not wait for it (and is refused where
// such memory cannot be taken). A lazily restored task holds none: CRIU's
// restorer hands the userfaultfd to the daemon and closes its own.
func Filling(pid int) (bool, error) {
	registered, err := hasVmFlag(pid, "um")
	if err != nil || !registered {
		return false, err
	}
	own, err := holdsUserfaultfd(pid)
	return !own, err
}

// holdsUserfaultfd reports whether task pid has a userfaultfd open.
func holdsUserfaultfd(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("lazy pages: reading the descriptors of task %d: %w", pid, err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(dir + "/" + fd.Name()); err == nil && target == "anon_inode:[userfaultfd]" {
			return true, nil
		}
	}
	return false, nil
}

// Registered reports whether task pid has memory registered with a
// userfaultfd in any mode (missing, write-protect or minor: "um", "uw",
// "ui"). Its clone would be reported to, and held by, whoever reads that
// userfaultfd, if it asked for fork events: such a task gets no twin.
func Registered(pid int) (bool, error) { return hasVmFlag(pid, "um", "uw", "ui") }

func hasVmFlag(pid int, want ...string) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return false, fmt.Errorf("lazy pages: reading the memory areas of task %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		flags, ok := strings.CutPrefix(sc.Text(), "VmFlags:")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(flags) {
			for _, w := range want {
				if f == w {
					return true, nil
				}
			}
		}
	}
	return false, sc.Err()
}
