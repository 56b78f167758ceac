package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// KeeperCgroup is the cgroup, at the top of a hierarchy, that holds tclone's
// keeper processes: those that must outlive the process that started them
// (a restore watchdog undoing a half-made sibling). Whoever stops or kills
// the caller's whole cgroup (a service manager restarting Podman, an OOM
// kill of the group) must not take the keeper with it.
const KeeperCgroup = "tclone-keepers"

// Escape moves pid into KeeperCgroup in every hierarchy through which a
// whole cgroup is killed or frozen: cgroup v2, and the v1 freezer, pids and
// name=systemd hierarchies. No other v1 hierarchy is touched; in particular
// a process is never moved in a v1 hierarchy that holds the memory
// controller. Under cgroup v2 the keeper cgroup is the one hierarchy, so a
// keeper's memory (a capture's CRIU, its page pipes included) is charged
// there.
func Escape(pid int) error {
	mounts, err := keeperHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, mnt := range mounts {
		dir := filepath.Join(mnt, KeeperCgroup)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, fmt.Errorf("creating keeper cgroup %s: %w", dir, err))
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			errs = append(errs, fmt.Errorf("moving process %d into %s: %w", pid, dir, err))
		}
	}
	return errors.Join(errs...)
}

// keeperHierarchies lists the mount points of the hierarchies Escape uses.
func keeperHierarchies() ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if strings.HasPrefix(m.Mountpoint, Root) && keeperMount(m.FSType, m.VFSOptions) {
			out = append(out, m.Mountpoint)
		}
	}
	return out, nil
}

// keeperMount decides from a mount's type and options whether it is a
// hierarchy Escape moves keepers in.
func keeperMount(fstype, options string) bool {
	if fstype == "cgroup2" {
		return true
	}
	if fstype != "cgroup" {
		return false
	}
	wanted := false
	for _, o := range strings.Split(options, ",") {
		switch o {
		case "memory":
			return false
		case "freezer", "pids", "name=systemd":
			wanted = true
		}
	}
	return wanted
}

// KillAll kills every process in the cgroup cgroupPath (and its children)
// and waits, up to five seconds, until it is empty. A restore that died
// midway can leave restored tasks that crun never recorded; only the cgroup
// still knows them.
func KillAll(cgroupPath string) error {
	clean := filepath.Clean("/" + cgroupPath)
	if cgroupPath == "" || strings.Contains(cgroupPath, ":") || clean == "/" {
		return nil
	}
	var dir string
	for _, candidate := range []string{filepath.Join(Root, clean), filepath.Join(Root, "pids", clean), filepath.Join(Root, "freezer", clean)} {
		if _, err := os.Stat(filepath.Join(candidate, "cgroup.procs")); err == nil {
			dir = candidate
			break
		}
	}
	if dir == "" {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := procsUnder(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds processes %v after SIGKILL", dir, pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procsUnder lists the processes of a cgroup and of its descendants.
func procsUnder(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}
