package calls

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// OwnerFile is written into every temporary directory a fork client makes,
// right after making it, so a collector can tell a dead client's directory
// from a live one's.
const OwnerFile = "owner.json"

// TempPrefixes are the name prefixes of the fork client's temporary
// directories (its private Podman service's, and its checkpoint archives'),
// and of a Kubernetes checkpoint image's (tclone kube checkpoint).
var TempPrefixes = []string{"podman-fork-", "tclone-fork-", "tclone-image-"}

// DirOwner is the content of OwnerFile.
type DirOwner struct {
	Owner journal.Owner `json:"owner"`
	// Service is a Podman service the client started for itself, living
	// in this directory. It dies with the client; a collector makes sure.
	Service *journal.Owner `json:"service,omitempty"`
}

// The fork clients of a host make their temporary directories in its
// layout's TempDir, root's and 0700. Nothing anyone else can write is ever
// looked at by a collector, which may remove what it finds there and
// signal the services it names.

// ensureTempDir makes TempDir, or checks that it is a directory (not a
// symlink) of this user's that no one else can enter.
func ensureTempDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating the fork clients' temporary directory %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the fork clients' temporary directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := ownedBySelf(fd); err != nil {
		return fmt.Errorf("the fork clients' temporary directory %s: %w: remove it", dir, err)
	}
	return unix.Fchmod(fd, 0o700)
}

// ownedBySelf refuses what another user owns, or what others may write.
func ownedBySelf(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, not %d", st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("writable by others (mode %#o)", st.Mode&0o7777)
	}
	return nil
}

// MkdirTemp makes a temporary directory named prefix<pid>-* (prefix one of
// TempPrefixes) in store.TempDir(), owned by the calling process. The PID
// in the name lets a collector remove at once a directory whose maker was
// killed before it could write the owner file.
func MkdirTemp(store plan.Store, prefix string) (string, error) {
	root := store.TempDir()
	if err := ensureTempDir(root); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(root, fmt.Sprintf("%s%d-", prefix, os.Getpid()))
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

// maxOwnerFile bounds what a collector reads of an owner file.
const maxOwnerFile = 64 << 10

// readDirOwner reads dir's owner file, which must be a regular file of
// this user's: opened without following a symlink and without waiting
// (a FIFO of that name answers at once, and is refused).
func readDirOwner(dir string) (*DirOwner, error) {
	path := filepath.Join(dir, OwnerFile)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > maxOwnerFile {
		return nil, fmt.Errorf("%s is not an owner file (%v, %d bytes)", path, st.Mode().Type(), st.Size())
	}
	if err := ownedBySelf(fd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxOwnerFile))
	if err != nil {
		return nil, err
	}
	var o DirOwner
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &o, nil
}

// isTempDir accepts only a fork client's temporary directory: a directory
// directly in root (TempDir) whose name has one of TempPrefixes. A record
// names the directories it removes, and nothing else may be removed
// through it.
func isTempDir(root, path string) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || filepath.Dir(path) != root {
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

// collectTempDirs removes the temporary directories of dead clients in
// root (TempDir), stopping first any Podman service such a client left
// running. Only a root of this user's that no one else can write is looked
// at, and in it only directories of this user's.
func collectTempDirs(root string, now time.Time, rep *Report) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the fork clients' temporary directory %s: %w", root, err)
	}
	err = ownedBySelf(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("the fork clients' temporary directory %s: %w; it is not collected until it is removed", root, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, de := range entries {
		path := filepath.Join(root, de.Name())
		if !de.IsDir() || !isTempDir(root, path) || !ownDir(path) {
			continue
		}
		if err := collectTempDir(path, now, rep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownDir reports whether path is a directory (not a symlink) of this
// user's.
func ownDir(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == os.Geteuid()
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
		// Not an owner file of a client's (another user's, a FIFO, a
		// symlink): nothing here is trusted, nothing is done.
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
