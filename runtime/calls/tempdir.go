package calls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
)

// OwnerFile is written into every temporary directory a fork client makes,
// right after making it, so a collector can tell a dead client's directory
// from a live one's.
const OwnerFile = "owner.json"

// TempPrefixes are the name prefixes of the fork client's temporary
// directories: its private Podman service's, and its checkpoint archives'.
var TempPrefixes = []string{"podman-fork-", "tclone-fork-"}

// DirOwner is the content of OwnerFile.
type DirOwner struct {
	Owner journal.Owner `json:"owner"`
	// Service is a Podman service the client started for itself, living
	// in this directory. It dies with the client; a collector makes sure.
	Service *journal.Owner `json:"service,omitempty"`
}

// MkdirTemp makes a temporary directory named prefix<pid>-* (prefix one of
// TempPrefixes) in the system's temporary directory, owned by the calling
// process. The PID in the name lets a collector remove at once a directory
// whose maker was killed before it could write the owner file.
func MkdirTemp(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("creating a temporary directory: %w", err)
	}
	if err := writeDirOwner(dir, DirOwner{Owner: journal.Self()}); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// RecordService notes in dir's owner file the Podman service started there.
func RecordService(dir string, service journal.Owner) error {
	o, err := readDirOwner(dir)
	if err != nil {
		return err
	}
	o.Service = &service
	return writeDirOwner(dir, *o)
}

func writeDirOwner(dir string, o DirOwner) error {
	path := filepath.Join(dir, OwnerFile)
	if err := atomicfile.WriteJSON(path, o, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func readDirOwner(dir string) (*DirOwner, error) {
	var o DirOwner
	if err := atomicfile.ReadJSON(filepath.Join(dir, OwnerFile), &o); err != nil {
		return nil, err
	}
	return &o, nil
}

// isTempDir accepts only a fork client's temporary directory: an absolute
// path whose name has one of TempPrefixes. A record names the directories
// it removes, and nothing else may be removed through it.
func isTempDir(path string) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false
	}
	for _, p := range TempPrefixes {
		if strings.HasPrefix(filepath.Base(path), p) {
			return true
		}
	}
	return false
}

// unownedAge is how old a client directory without an owner file must be
// before it is taken for an older client's leftover, when the PID its name
// gives runs (maybe reused) or its name gives none. A live client writes the
// file microseconds after making the directory.
const unownedAge = 10 * time.Minute

// makerGone reports whether a temporary directory's name gives the PID of
// its maker (PREFIX<pid>-RANDOM) and no such process runs any more.
func makerGone(path string) bool {
	name := filepath.Base(path)
	for _, p := range TempPrefixes {
		if rest, ok := strings.CutPrefix(name, p); ok {
			pidText, _, found := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidText)
			if !found || err != nil || pid <= 0 {
				return false
			}
			o, ok := journal.OwnerOf(pid)
			return !ok || !o.Running()
		}
	}
	return false
}

// collectTempDirs removes the temporary directories of dead clients under
// roots, stopping first any Podman service such a client left running.
func collectTempDirs(roots []string, now time.Time, rep *Report) error {
	var errs []error
	seen := map[string]bool{}
	for _, root := range roots {
		entries, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, de := range entries {
			path := filepath.Join(root, de.Name())
			if seen[path] || !de.IsDir() || !isTempDir(path) {
				continue
			}
			seen[path] = true
			if err := collectTempDir(path, now, rep); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func collectTempDir(path string, now time.Time, rep *Report) error {
	o, err := readDirOwner(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Its maker was killed before writing the owner file, or is
		// about to write it.
		st, serr := os.Stat(path)
		if serr != nil {
			return nil
		}
		if now.Sub(st.ModTime()) < unownedAge && !makerGone(path) {
			return nil
		}
	case err != nil:
		return err
	case o.Owner.Running():
		return nil
	case o.Service != nil && o.Service.Running():
		if err := stopService(*o.Service); err != nil {
			return err
		}
		rep.Services = append(rep.Services, o.Service.Pid)
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("removing a dead fork client's directory: %w", err)
	}
	rep.TempDirs = append(rep.TempDirs, path)
	return nil
}

// stopService stops a dead client's Podman service: TERM, then KILL. Only
// the service: a runtime it was running (tclone checkpoint, say) finishes on
// its own, and is recovered by its own journal if it dies.
func stopService(o journal.Owner) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !o.Running() {
			return nil
		}
		syscall.Kill(o.Pid, sig)
		deadline := time.Now().Add(10 * time.Second)
		for o.Running() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if o.Running() {
		return fmt.Errorf("the Podman service %d of a dead fork client does not exit after SIGKILL", o.Pid)
	}
	return nil
}
