package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"

	"github.com/tclone/tclone/runtime/procfs"
)

// A CRIU dump that manages cgroups walks the dumped tasks' cgroups in every
// hierarchy they belong to. Unless it is given a yard (CRIU's cgroup_yard:
// a directory holding each hierarchy under the name CRIU gives it), it
// mounts every hierarchy afresh for that walk, while it holds the tree, and
// a fresh cgroup2 mount waits until the kernel has finished taking down
// cgroups removed shortly before: 10-20 ms of the source's pause here,
// after a sibling was removed. The hierarchies are mounted on the host
// already; a yard of symbolic links to those mounts costs nothing.

// Yard makes, in dir (created, and empty or absent), a CRIU cgroup yard
// for a dump of process pid: a link per hierarchy pid belongs to, named as
// CRIU names it (the controllers of its /proc/PID/cgroup line, "name="
// dropped, "unified" for cgroup v2), to the mount of that whole hierarchy.
// It fails, naming the hierarchy, when one is not mounted whole here; the
// dump then does without a yard.
func Yard(dir string, pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return err
	}
	links, err := yardLinks(procfs.ParseCgroups(string(b)), mounts)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("cgroup yard: %w", err)
		}
	}
	return nil
}

// yardLinks maps each hierarchy of cgs to the mount point of a mount of
// that whole hierarchy (its root), by the name CRIU opens in a yard.
func yardLinks(cgs []procfs.Cgroup, mounts []*mountinfo.Info) (map[string]string, error) {
	links := map[string]string{}
	for _, cg := range cgs {
		name, want := yardName(cg.Controllers)
		var found string
		for _, m := range mounts {
			if m.Root != "/" || !strings.HasPrefix(m.Mountpoint, "/") {
				continue
			}
			if want == nil && m.FSType == "cgroup2" || want != nil && m.FSType == "cgroup" && hasControllers(m.VFSOptions, want) {
				found = m.Mountpoint
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("the cgroup hierarchy %q is not mounted whole here", cg.Controllers)
		}
		links[name] = found
	}
	return links, nil
}

// yardName is the name CRIU opens in a yard for the controllers field of a
// /proc/PID/cgroup line, and that field's controllers (nil for cgroup v2).
func yardName(controllers string) (string, []string) {
	if controllers == "" {
		return "unified", nil
	}
	return strings.TrimPrefix(controllers, "name="), strings.Split(controllers, ",")
}

// hasControllers says whether a cgroup v1 mount's options name exactly the
// controllers want (a hierarchy has one set of controllers, in any order).
func hasControllers(options string, want []string) bool {
	var have []string
	for _, o := range strings.Split(options, ",") {
		if strings.HasPrefix(o, "name=") || isController(o) {
			have = append(have, o)
		}
	}
	if len(have) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// isController says whether a cgroup v1 mount option is a controller's name
// rather than a mount option of cgroup's own.
func isController(o string) bool {
	switch o {
	case "rw", "ro", "noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods", "none", "all":
		return false
	}
	return !strings.Contains(o, "=")
}
