// Package cgroups knows the container cgroup operations a fork needs on both
// cgroup v1 (and hybrid) hosts and pure cgroup v2 hosts: reading and
// changing freezer state, and removing what a failed sibling left behind.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where cgroup filesystems are mounted.
var Root = "/sys/fs/cgroup"

// Unified reports whether Root itself is cgroup v2 (no v1 hierarchies). On
// hybrid hosts (v1 controllers plus cgroup2 at Root/unified) the freezer is
// the v1 one, as crun uses it.
func Unified() bool {
	var fs unix.Statfs_t
	return unix.Statfs(Root, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC
}

// Freezer is a container cgroup's freezer.
type Freezer struct {
	// Dir is the cgroup directory CRIU's freeze_cgroup option takes.
	Dir string
	V2  bool
}

// FreezerFor returns the freezer of the cgroup crun recorded for a container.
func FreezerFor(cgroupPath string) *Freezer {
	if Unified() {
		return &Freezer{Dir: filepath.Join(Root, cgroupPath), V2: true}
	}
	return &Freezer{Dir: filepath.Join(Root, "freezer", cgroupPath)}
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

// Freeze freezes the cgroup and waits, polling finely, until every task is
// frozen. CRIU's own freezer wait sleeps in 100 ms steps; freezing before
// CRIU looks saves the source that much pause.
func (f *Freezer) Freeze(timeout time.Duration) error {
	file, value := filepath.Join(f.Dir, "freezer.state"), "FROZEN"
	if f.V2 {
		file, value = filepath.Join(f.Dir, "cgroup.freeze"), "1"
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		return fmt.Errorf("freezing %s: %w", f.Dir, err)
	}
	deadline := time.Now().Add(timeout)
	for delay := 100 * time.Microsecond; ; {
		done, err := f.fullyFrozen()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freezing %s: not frozen after %s (a task in uninterruptible sleep?)", f.Dir, timeout)
		}
		// cgroup v1 leaves tasks it could not freeze at once in FREEZING
		// until asked again; v2 completes on its own.
		if !f.V2 {
			if err := os.WriteFile(file, []byte(value), 0); err != nil {
				return fmt.Errorf("freezing %s: %w", f.Dir, err)
			}
		}
		time.Sleep(delay)
		if delay < 5*time.Millisecond {
			delay *= 2
		}
	}
}

// fullyFrozen reports whether the freeze has completed (v1 FROZEN, v2
// "frozen 1" in cgroup.events), as opposed to merely requested.
func (f *Freezer) fullyFrozen() (bool, error) {
	if f.V2 {
		data, err := os.ReadFile(filepath.Join(f.Dir, "cgroup.events"))
		if err != nil {
			return false, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line == "frozen 1" {
				return true, nil
			}
		}
		return false, nil
	}
	data, err := os.ReadFile(filepath.Join(f.Dir, "freezer.state"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(data)) == "FROZEN", nil
}
