// Package tempdir makes temporary directories that name the processes
// owning them, so that `tclone gc` can remove those whose owners died: a
// fork client killed mid-fork leaves its checkpoint archives, and the socket
// and log of the Podman service it started, in directories nobody else
// knows about.
//
// A directory made by Make holds OwnerFile, JSON of this form:
//
//	{"version": 1, "owners": [{"pid": 4242, "start_time": 1234567}]}
//
// start_time is field 22 of /proc/PID/stat (clock ticks since boot), which
// with the PID names a process even after its PID is reused. The directory
// is in use while any owner runs.
package tempdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/journal"
)

// OwnerFile is the owners record inside a directory made by Make.
const OwnerFile = ".tclone-owner.json"

// The name prefixes of tclone's temporary directories.
const (
	ForkPrefix    = "tclone-fork-" // a fork client's archives
	ServicePrefix = "podman-fork-" // a private Podman service's socket and log
)

// Prefixes lists every prefix Collect looks for.
var Prefixes = []string{ForkPrefix, ServicePrefix}

// LegacyAge is how old a directory without an owner record (made by a
// tclone from before owners were recorded) must be before Collect removes
// it: far longer than any fork can take.
const LegacyAge = 24 * time.Hour

type owners struct {
	Version int             `json:"version"`
	Owners  []journal.Owner `json:"owners"`
}

// Make creates a directory in os.TempDir() named prefix plus a random part,
// owned by the calling process.
func Make(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := write(dir, owners{Version: 1, Owners: []journal.Owner{journal.Self()}}); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// AddOwner records process pid as an owner of dir too: the directory stays
// while it runs (a service that listens on a socket in it, say).
func AddOwner(dir string, pid int) error {
	_, start, err := journal.ProcessState(pid)
	if err != nil {
		return fmt.Errorf("recording process %d as an owner of %s: %w", pid, dir, err)
	}
	o, err := read(dir)
	if err != nil {
		return err
	}
	o.Owners = append(o.Owners, journal.Owner{Pid: pid, StartTime: start})
	return write(dir, o)
}

func read(dir string) (owners, error) {
	var o owners
	data, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if err != nil {
		return o, err
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("decoding %s: %w", filepath.Join(dir, OwnerFile), err)
	}
	return o, nil
}

func write(dir string, o owners) error {
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, OwnerFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("recording the owner of %s: %w", dir, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("recording the owner of %s: %w", dir, err)
	}
	return nil
}

// Collect removes, from each of roots, the directories with one of
// Prefixes whose every owner has died, and those without an owner record
// older than LegacyAge. It returns what it removed.
func Collect(roots []string, now time.Time) ([]string, error) {
	var removed []string
	var errs []error
	seen := map[string]bool{}
	for _, root := range roots {
		if seen[filepath.Clean(root)] {
			continue
		}
		seen[filepath.Clean(root)] = true
		entries, err := os.ReadDir(root)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for _, ent := range entries {
			if !ent.IsDir() || !hasPrefix(ent.Name()) {
				continue
			}
			dir := filepath.Join(root, ent.Name())
			if !abandoned(dir, now) {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// DefaultRoots are where Collect looks: the temporary directory of this
// process and /tmp, where clients with another TMPDIR usually still are.
func DefaultRoots() []string { return []string{os.TempDir(), "/tmp"} }

func hasPrefix(name string) bool {
	for _, p := range Prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// abandoned reports whether no owner of dir runs any more.
func abandoned(dir string, now time.Time) bool {
	o, err := read(dir)
	if errors.Is(err, os.ErrNotExist) {
		// Made before owners were recorded, or just now by Make, which
		// writes the record right after creating the directory.
		st, err := os.Stat(dir)
		return err == nil && now.Sub(st.ModTime()) > LegacyAge
	}
	if err != nil || len(o.Owners) == 0 {
		return false
	}
	for _, owner := range o.Owners {
		if owner.Alive() {
			return false
		}
	}
	return true
}
