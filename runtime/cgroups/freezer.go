// Package cgroups knows the container cgroup operations a fork needs on both
// cgroup v1 (and hybrid) hosts and pure cgroup v2 hosts: listing a
// container's processes, thawing a freezer that an older tclone's capture
// left frozen, and removing what a failed sibling left behind.
//
// Captures do not freeze: a frozen cgroup outlives every process that could
// thaw it, while CRIU's ptrace hold on a tree ends when CRIU dies.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where the kernel's cgroup filesystems are mounted: the host's, not
// tclone's, so no Layout names it.
const Root = "/sys/fs/cgroup"

// Unified reports whether Root itself is cgroup v2 (no v1 hierarchies). On
// hybrid hosts (v1 controllers plus cgroup2 at Root/unified) the freezer is
// the v1 one, as crun uses it.
func Unified() bool {
	var fs unix.Statfs_t
	return unix.Statfs(Root, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC
}

// ProcsDir returns a directory of the cgroup crun recorded for a container
// whose cgroup.procs lists the container's processes: the cgroup itself on
// cgroup v2, its freezer hierarchy's directory on v1 (crun always makes it).
func ProcsDir(cgroupPath string) string {
	if Unified() {
		return filepath.Join(Root, cgroupPath)
	}
	return filepath.Join(Root, "freezer", cgroupPath)
}

// Procs lists the processes of the cgroup directory dir.
func Procs(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("listing the processes of cgroup %s: %w", dir, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Freezer is a container cgroup's freezer. tclone no longer freezes; it
// thaws only what a capture of an older version left frozen.
type Freezer struct {
	Dir string
	V2  bool
}

// Frozen reports whether the cgroup is frozen or freezing.
func (f *Freezer) Frozen() (bool, error) {
	if f.V2 {
		data, err := os.ReadFile(filepath.Join(f.Dir, "cgroup.freeze"))
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(string(data)) == "1", nil
	}
	data, err := os.ReadFile(filepath.Join(f.Dir, "freezer.state"))
	if err != nil {
		return false, err
	}
	s := strings.TrimSpace(string(data))
	return s == "FROZEN" || s == "FREEZING", nil
}

// Thaw lets the cgroup's tasks run again and waits until the kernel agrees.
func (f *Freezer) Thaw() error {
	file, value := filepath.Join(f.Dir, "freezer.state"), "THAWED"
	if f.V2 {
		file, value = filepath.Join(f.Dir, "cgroup.freeze"), "0"
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.WriteFile(file, []byte(value), 0); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				// The cgroup is gone, and with it anything to thaw.
				return nil
			}
			return fmt.Errorf("thawing %s: %w", f.Dir, err)
		}
		frozen, err := f.Frozen()
		if err != nil || !frozen {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("thawing %s: still frozen after 5s", f.Dir)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ThawIfFrozen thaws the cgroup if it is frozen and reports whether it was.
func (f *Freezer) ThawIfFrozen() (bool, error) {
	frozen, err := f.Frozen()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if !frozen {
		return false, nil
	}
	return true, f.Thaw()
}
