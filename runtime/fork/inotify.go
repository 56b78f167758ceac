package fork

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/procfs"
)

// watchedInode is the target of an inotify watch or a fanotify inode mark.
type watchedInode struct {
	dev uint32 // kernel encoding, as fdinfo prints sdev
	ino uint64
}

// irmapWalkBudget bounds the search for watched files. It runs before the
// source is frozen; what it does not find, CRIU looks for itself.
const irmapWalkBudget = 3 * time.Second

// primeIrmap finds the paths of the files the tree rooted at pid watches
// and leaves them to CRIU as its irmap cache in workDir (see
// criuhooks.WriteIrmapCache). It only ever helps: a watch it misses is as
// it would have been without it.
func primeIrmap(workDir string, pid int) error {
	watched, err := watchedInodes(procfs.Tree(pid))
	if err != nil || len(watched) == 0 {
		return err
	}
	// The trailing slash makes the walk follow the root link.
	root := fmt.Sprintf("/proc/%d/root/", pid)
	entries := findInodes(root, watched, time.Now().Add(irmapWalkBudget))
	if len(entries) == 0 {
		return nil
	}
	return criuhooks.WriteIrmapCache(workDir, entries)
}

// watchedInodes reads the inotify watches and fanotify inode marks of the
// processes' descriptors.
func watchedInodes(pids []int) (map[watchedInode]bool, error) {
	watched := map[watchedInode]bool{}
	for _, pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // gone since
		}
		for _, fd := range fds {
			link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if link != "anon_inode:inotify" && link != "anon_inode:[fanotify]" {
				continue
			}
			f, err := os.Open(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
			if err != nil {
				continue
			}
			parseWatches(bufio.NewScanner(f), watched)
			f.Close()
		}
	}
	return watched, nil
}

// parseWatches reads "inotify wd:1 ino:984381 sdev:3b ..." and
// "fanotify ino:... sdev:... mflags:..." lines of an fdinfo file.
func parseWatches(sc *bufio.Scanner, into map[watchedInode]bool) {
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "inotify ") && !strings.HasPrefix(line, "fanotify ino:") {
			continue
		}
		var w watchedInode
		var ok int
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, ":")
			switch k {
			case "ino":
				if n, err := strconv.ParseUint(v, 16, 64); err == nil {
					w.ino, ok = n, ok+1
				}
			case "sdev":
				if n, err := strconv.ParseUint(v, 16, 32); err == nil {
					w.dev, ok = uint32(n), ok+1
				}
			}
		}
		if ok == 2 {
			into[w] = true
		}
	}
}

// kernelDev encodes a stat device number the way the kernel prints it.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}

// findInodes walks root for the watched inodes, staying on the filesystems
// they live on, until all are found or the deadline passes. It takes the
// found ones out of watched.
func findInodes(root string, watched map[watchedInode]bool, deadline time.Time) []criuhooks.IrmapEntry {
	devs := map[uint32]bool{}
	for w := range watched {
		devs[w.dev] = true
	}
	left := len(watched)
	var found []criuhooks.IrmapEntry
	errStop := errors.New("stop")
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errStop
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil {
			return nil
		}
		dev := kernelDev(st.Dev)
		if !devs[dev] {
			if d.IsDir() && path != root {
				return fs.SkipDir // another mount: not where the watches are
			}
			return nil
		}
		w := watchedInode{dev: dev, ino: st.Ino}
		if watched[w] {
			rel, _ := filepath.Rel(root, path)
			found = append(found, criuhooks.IrmapEntry{Dev: w.dev, Inode: w.ino, Path: filepath.Join("/", rel)})
			delete(watched, w)
			if left--; left == 0 {
				return errStop
			}
		}
		return nil
	})
	return found
}
