package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// RemoveLeftovers removes the directories of cgroupPath (a cgroupfs-style
// path such as /libpod_parent/libpod-ID) from every mounted hierarchy, leaf
// directories first. A failed restore can leave them behind, and the next
// container with the same path then fails to start. Directories that still
// hold processes are left alone and reported.
func RemoveLeftovers(cgroupPath string) error {
	if cgroupPath == "" || strings.Contains(cgroupPath, ":") {
		// Empty, or a systemd unit spec: systemd owns those.
		return nil
	}
	clean := filepath.Clean("/" + cgroupPath)
	if clean == "/" {
		return nil
	}
	var dirs []string
	if Unified() {
		dirs = []string{filepath.Join(Root, clean)}
	} else {
		entries, err := os.ReadDir(Root)
		if err != nil {
			return err
		}
		for _, e := range entries {
			dirs = append(dirs, filepath.Join(Root, e.Name(), clean))
		}
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, removeTree(d))
	}
	return errors.Join(errs...)
}

func removeTree(dir string) error {
	var all []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			all = append(all, path)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(all)))
	for _, d := range all {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing cgroup %s: %w", d, err)
		}
	}
	return nil
}
