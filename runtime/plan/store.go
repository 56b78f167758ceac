package plan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/flock"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/rootfs"
)

// Store is tclone's state on a host, laid out by its Layout: the plans,
// their intents, uses and locks.
type Store struct{ Layout }

// Dir is the directory of plan id.
func (s Store) Dir(id string) string { return filepath.Join(s.PlansDir(), id) }

// ImagesDir is where CRIU's images of plan id are.
func ImagesDir(dir string) string { return filepath.Join(dir, "images") }

// WorkDir is where CRIU's dump log of plan id is.
func WorkDir(dir string) string { return filepath.Join(dir, "work") }

// EnsureTmpfs makes sure the plan store is a tmpfs, mounting one if the host's
// /run is an ordinary disk directory (as on some VM images). Page images
// must never be written to disk: it would make every fork as slow as the disk.
func (s Store) EnsureTmpfs() error {
	dir := s.PlansDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating plan store %s: %w", dir, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		return nil
	}
	if err := unix.Mount("tclone-plans", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mounting tmpfs on the plan store %s (page images must stay in memory): %w", dir, err)
	}
	return nil
}

// Create makes a new, empty plan directory.
func (s Store) Create() (id, dir string, err error) {
	if err := s.EnsureTmpfs(); err != nil {
		return "", "", err
	}
	id = NewID()
	dir, err = s.CreateDir(id)
	if err != nil {
		return "", "", err
	}
	return id, dir, nil
}

// CreateDir makes the directory of the plan with this ID (see NewID), for
// a caller that records the plan's path before it exists: a process killed
// in between then leaves a record of nothing rather than a directory no
// record names.
func (s Store) CreateDir(id string) (string, error) {
	if err := s.EnsureTmpfs(); err != nil {
		return "", err
	}
	dir := s.Dir(id)
	for _, d := range []string{dir, ImagesDir(dir), WorkDir(dir)} {
		if err := os.Mkdir(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("creating plan directory: %w", err)
		}
	}
	return dir, nil
}

var idRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// ValidID reports whether id has the form NewID gives plans.
func ValidID(id string) bool { return idRE.MatchString(id) }

// ErrNotInStore reports a plan reference outside this host's plan store.
var ErrNotInStore = errors.New("not a fork plan in this host's plan store")

// Resolve turns a plan reference (an ID, or a path to a plan directory or to
// anything inside it) into the plan's directory. Only plans in the store are
// plans: their contents are written by tclone alone, and a plan names host
// paths that tclone copies from and removes, so a directory elsewhere (say,
// one extracted from an imported archive) must never be taken for one.
func (s Store) Resolve(ref string) (string, error) {
	if ValidID(ref) {
		return s.Dir(ref), nil
	}
	if !filepath.IsAbs(ref) {
		return "", fmt.Errorf("%w: %q is neither a plan ID nor an absolute path", ErrNotInStore, ref)
	}
	rel, err := filepath.Rel(s.PlansDir(), filepath.Clean(ref))
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%w: %s is outside %s", ErrNotInStore, ref, s.PlansDir())
	}
	id := strings.Split(rel, string(filepath.Separator))[0]
	if !ValidID(id) {
		return "", fmt.Errorf("%w: %s names no plan ID", ErrNotInStore, ref)
	}
	return s.Dir(id), nil
}

// Contains reports whether path lies inside the plan store.
func (s Store) Contains(path string) bool {
	rel, err := filepath.Rel(s.PlansDir(), filepath.Clean(path))
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// readDir is os.ReadDir of a directory that may not exist yet: then it
// holds nothing.
func readDir(dir string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return entries, err
}

// List returns the IDs of all plans in the store.
func (s Store) List() ([]string, error) {
	entries, err := readDir(s.PlansDir())
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Remove deletes a plan and its root filesystem capture. A plan that is
// already gone is not an error.
//
// The directory is first renamed out of the store's namespace (a dot name,
// which List, Resolve and every path a plan's writers hold never reach):
// a writer still at work on the plan by its path, such as a lazy-pages
// daemon publishing drained images, then finds nothing there, instead of
// putting a file back while the directory is emptied (which also makes its
// removal fail, and leaves it).
func (s Store) Remove(dir string) error {
	var errs []error
	if p, err := Read(dir); err == nil && p.Rootfs != nil {
		errs = append(errs, p.Rootfs.Remove())
	}
	// A capture that died before plan.json was written may have left its
	// snapshot under the conventional name, or beside a btrfs subvolume.
	errs = append(errs, s.RemoveSnapshots(filepath.Base(dir)))
	doomed := filepath.Join(filepath.Dir(dir), removingPrefix+filepath.Base(dir)+"-"+NewID())
	switch err := os.Rename(dir, doomed); {
	case errors.Is(err, os.ErrNotExist):
		return errors.Join(errs...)
	case err != nil:
		doomed = dir // removed in place, as before
	}
	return errors.Join(append(errs, removeAllSettled(doomed))...)
}

// removingPrefix names a plan directory being removed (Remove).
const removingPrefix = ".removing-"

// InGonePlan reports whether path, as the kernel shows a process's working
// directory (/proc/PID/cwd, " (deleted)" appended once it is removed), lies
// in a plan of this store that no longer exists: one removed, or renamed
// out of the store's namespace by Remove. A path outside the plans
// directory, or in a plan that is still there, is not.
func (s Store) InGonePlan(path string) bool {
	rel, ok := strings.CutPrefix(strings.TrimSuffix(path, " (deleted)"), s.PlansDir()+"/")
	if !ok {
		return false
	}
	name, _, _ := strings.Cut(rel, "/")
	if strings.HasPrefix(name, removingPrefix) {
		return true
	}
	if !ValidID(name) {
		return false
	}
	_, err := os.Lstat(s.Dir(name))
	return errors.Is(err, os.ErrNotExist)
}

// removeAllSettled is os.RemoveAll, tried again while a write that had
// reached the directory before it was renamed lands in it meanwhile.
func removeAllSettled(dir string) error {
	var err error
	for range 20 {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// CollectRemoving finishes the removals of plans whose remover died
// midway (Remove), and returns the directories it removed.
func (s Store) CollectRemoving() ([]string, error) {
	doomed, err := filepath.Glob(filepath.Join(s.PlansDir(), removingPrefix+"*"))
	if err != nil {
		return nil, err
	}
	var errs []error
	var removed []string
	for _, d := range doomed {
		if err := removeAllSettled(d); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
	}
	return removed, errors.Join(errs...)
}

// ExternalSnapshotSuffix marks, in SnapshotRoot, a snapshot kept elsewhere
// (a btrfs snapshot lives beside its subvolume). The marker holds its path,
// so a snapshot whose plan was lost (the store is tmpfs: a reboot loses it)
// is still found and removed.
const ExternalSnapshotSuffix = ".external"

// RecordExternalSnapshot notes, before it is taken, a snapshot of plan id
// that lives outside SnapshotRoot.
func (s Store) RecordExternalSnapshot(id, path string) error {
	if err := os.MkdirAll(s.SnapshotRoot, 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.SnapshotRoot, id+ExternalSnapshotSuffix), []byte(path), 0o600)
}

// VolumesSuffix names, in SnapshotRoot, the directory of a plan's volume
// copies: <id>.volumes.
const VolumesSuffix = ".volumes"

// VolumesDir is where the copies of plan id's volumes go.
func (s Store) VolumesDir(id string) string {
	return filepath.Join(s.SnapshotRoot, id+VolumesSuffix)
}

// RemoveSnapshots removes the snapshots of plan id: the one in
// SnapshotRoot, an external one its marker names, and its volume copies.
func (s Store) RemoveSnapshots(id string) error {
	if s.SnapshotRoot == "" || !ValidID(id) {
		return nil
	}
	var errs []error
	marker := filepath.Join(s.SnapshotRoot, id+ExternalSnapshotSuffix)
	if path, err := os.ReadFile(marker); err == nil {
		snap := rootfs.Snapshot{Kind: rootfs.KindBtrfs, Path: string(path)}
		if err := snap.Remove(); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, os.Remove(marker))
		}
	}
	errs = append(errs, os.RemoveAll(filepath.Join(s.SnapshotRoot, id)), os.RemoveAll(s.VolumesDir(id)))
	return errors.Join(errs...)
}

// RemoveCapturedSince removes the plans of source captured at or after
// since. A fork client uses it when its checkpoint failed after tclone had
// already captured, so it never learned the plan's ID.
func (s Store) RemoveCapturedSince(source string, since time.Time) error {
	ids, err := s.List()
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		p, err := Read(s.Dir(id))
		if err != nil || p.Source.ID != source || p.CreatedAt.Before(since) {
			continue
		}
		errs = append(errs, s.Remove(s.Dir(id)))
	}
	return errors.Join(errs...)
}

// Uses is the use-count record of a plan.
type Uses struct {
	// Remaining materialisations; -1 means unlimited until expiry.
	Remaining int `json:"remaining"`
	// InFlight are the processes materialising a sibling right now, each
	// holding one use. A use whose holder died is given back (Reap), so a
	// crash at any point neither leaks a use nor returns one twice.
	InFlight []journal.Owner `json:"in_flight"`
	// Client is the fork client the remaining uses are held for, recorded
	// from its intent at capture (SetUses). Once it has died no one will
	// ask for them, so the plan is removed as soon as no restore holds a
	// use, instead of at its expiry.
	Client *journal.Owner `json:"client,omitempty"`
}

// abandoned reports whether the client the plan is held for has died.
func (u Uses) abandoned() bool {
	return u.Client != nil && !u.Client.Alive()
}

// Unlimited marks a plan that serves any number of siblings until it expires.
const Unlimited = forkopts.Unlimited

func usesPath(dir string) string { return filepath.Join(dir, "uses") }

// SetUses records how many siblings plan dir may still make, and the fork
// client they are held for (nil: none, the plan lives until it expires).
// Both are written at once, so that no crash can leave a plan made for a
// client without its client recorded.
func SetUses(dir string, n int, client *journal.Owner) error {
	return withLock(dir, func() error {
		return atomicfile.WriteJSON(usesPath(dir), Uses{Remaining: n, Client: client}, 0o600)
	})
}

// ReadUses returns a plan's use count.
func ReadUses(dir string) (Uses, error) {
	var u Uses
	err := atomicfile.ReadJSON(usesPath(dir), &u)
	return u, err
}

// ErrUsedUp reports a plan whose every use has been taken.
var ErrUsedUp = errors.New("fork plan has no uses left; capture a new one")

// ErrExpired reports a plan past its expiry.
var ErrExpired = errors.New("fork plan expired; capture a new one")

// ErrClientGone reports a plan whose fork client died: its siblings would
// be made for no one, who could neither report them nor roll them back.
var ErrClientGone = errors.New("the fork client this plan was captured for is gone; fork again")

// Lease is one in-flight use of a plan.
type Lease struct {
	store Store
	dir   string
	owner journal.Owner
	done  bool
}

// Acquire takes one use of the plan in dir for the calling process.
func (s Store) Acquire(dir string) (*Lease, error) {
	owner := journal.Self()
	err := withLock(dir, func() error {
		p, err := Read(dir)
		if err != nil {
			return err
		}
		if time.Now().After(p.ExpiresAt) {
			return fmt.Errorf("%w (%s, at %s)", ErrExpired, dir, p.ExpiresAt.Format(time.RFC3339))
		}
		u, err := ReadUses(dir)
		if err != nil {
			return fmt.Errorf("reading uses of plan %s: %w", dir, err)
		}
		u = reap(u)
		if u.Remaining == 0 {
			return fmt.Errorf("%w (%s)", ErrUsedUp, dir)
		}
		if u.abandoned() {
			return fmt.Errorf("%w (plan %s, client pid %d)", ErrClientGone, dir, u.Client.Pid)
		}
		if u.Remaining > 0 {
			u.Remaining--
		}
		u.InFlight = append(u.InFlight, owner)
		return atomicfile.WriteJSON(usesPath(dir), u, 0o600)
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s (it was used up, expired or never completed; capture a new one)", ErrNotFound, dir)
	}
	if err != nil {
		return nil, err
	}
	return &Lease{store: s, dir: dir, owner: owner}, nil
}

// Release ends the lease. A failed use is given back. When no use remains
// and none is in flight, the plan is removed.
func (l *Lease) Release(succeeded bool) error {
	if l == nil || l.done {
		return nil
	}
	l.done = true
	return l.store.settle(l.dir, func(u *Uses) {
		for i, o := range u.InFlight {
			if o == l.owner {
				u.InFlight = append(u.InFlight[:i], u.InFlight[i+1:]...)
				if !succeeded && u.Remaining >= 0 {
					u.Remaining++
				}
				return
			}
		}
	})
}

// reap gives back the uses of holders that died.
func reap(u Uses) Uses {
	live := u.InFlight[:0]
	for _, o := range u.InFlight {
		if o.Alive() {
			live = append(live, o)
		} else if u.Remaining >= 0 {
			u.Remaining++
		}
	}
	u.InFlight = live
	return u
}

// Why Sweep removed a plan.
const (
	SweptUsedUp     = "used-up"
	SweptExpired    = "expired"
	SweptClientGone = "client-gone" // the fork client it was held for died
)

// Sweep gives back the uses of dead holders of plan dir, and removes the
// plan when nothing is in flight and it is used up, expired, or held for a
// client that died. It returns why it removed the plan, or "".
func (s Store) Sweep(dir string, now time.Time) (removed string, err error) {
	p, err := Read(dir)
	if err != nil {
		return "", nil
	}
	err = s.settle(dir, func(u *Uses) {
		*u = reap(*u)
		if len(u.InFlight) > 0 {
			return
		}
		switch {
		case u.Remaining == 0:
			removed = SweptUsedUp
		case now.After(p.ExpiresAt):
			u.Remaining = 0
			removed = SweptExpired
		case u.abandoned():
			removed = SweptClientGone
		}
	})
	if err != nil {
		return "", err
	}
	return removed, nil
}

// settle changes a plan's uses under its lock and removes the plan, still
// under the lock, when none is in flight and none remains or its client
// is gone: an Acquire waiting on the lock then finds no plan rather than a
// half-removed one.
func (s Store) settle(dir string, change func(*Uses)) error {
	err := withLock(dir, func() error {
		u, err := ReadUses(dir)
		if err != nil {
			return err
		}
		change(&u)
		if len(u.InFlight) == 0 && (u.Remaining == 0 || u.abandoned()) {
			return s.Remove(dir)
		}
		return atomicfile.WriteJSON(usesPath(dir), u, 0o600)
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// withLock runs fn holding the lock of plan dir. A plan removed while its
// lock was awaited fails with an error that wraps os.ErrNotExist.
func withLock(dir string, fn func() error) error {
	unlock, err := flock.Lock(context.Background(), filepath.Join(dir, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}
