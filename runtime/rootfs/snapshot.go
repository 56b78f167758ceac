// Package rootfs captures a container's root filesystem at the fork instant
// and rebuilds it under a sibling.
//
// What is captured depends on what the root is:
//   - an overlay mount (Podman's case): only the upper layer, the container's
//     own writes, whiteouts and opaque directories included; the image layers
//     below are immutable and shared, not copied;
//   - a btrfs subvolume: a read-only subvolume snapshot, which costs no copy;
//   - a plain directory (a bare OCI bundle): a full copy.
//
// Copies share data by reflink where the filesystem can.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Kind is how a root filesystem is captured.
type Kind string

const (
	KindOverlay Kind = "overlay"
	KindBtrfs   Kind = "btrfs"
	KindDir     Kind = "dir"
)

// Source is a container root filesystem, ready to be captured.
type Source struct {
	Kind Kind
	Root string
	// For KindOverlay.
	LowerDirs []string // top first
	UpperDir  string
}

// Snapshot is a captured root filesystem.
type Snapshot struct {
	Kind Kind `json:"kind"`
	// Path holds the capture: the upper layer's copy (overlay), the full
	// copy (dir) or the read-only subvolume (btrfs).
	Path string `json:"path"`
	// LowerDirs are the image layers under an overlay capture, top first.
	// They are shared with the source, never copied.
	LowerDirs []string `json:"lower_dirs,omitempty"`
	Stats     Stats    `json:"stats"`
}

const btrfsSuperMagic = 0x9123683e

// btrfsSubvolRootIno is the inode number of every btrfs subvolume's root.
const btrfsSubvolRootIno = 256

// Detect works out how root can be captured.
func Detect(root string) (Source, error) {
	m, isMount, err := mountAt(root)
	if err != nil {
		return Source{}, fmt.Errorf("inspecting root filesystem %s: %w", root, err)
	}
	if isMount && m.FSType == "overlay" {
		layers, err := parseOverlayOpts(m.VFSOptions)
		if err != nil {
			return Source{}, fmt.Errorf("root filesystem %s: %w", root, err)
		}
		return Source{Kind: KindOverlay, Root: root, LowerDirs: layers.Lower, UpperDir: layers.Upper}, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return Source{}, fmt.Errorf("statfs %s: %w", root, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return Source{}, fmt.Errorf("stat %s: %w", root, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return Source{}, fmt.Errorf("root filesystem %s is not a directory", root)
	}
	if uint32(fs.Type) == btrfsSuperMagic && st.Ino == btrfsSubvolRootIno {
		return Source{Kind: KindBtrfs, Root: root}, nil
	}
	return Source{Kind: KindDir, Root: root}, nil
}

// SnapshotDir picks where a capture of src named name is kept. A btrfs
// snapshot must live on the same filesystem as its subvolume; the others go
// under base.
func SnapshotDir(src Source, base, name string) string {
	if src.Kind == KindBtrfs {
		return filepath.Join(filepath.Dir(src.Root), ".tclone-"+name)
	}
	return filepath.Join(base, name)
}

// Take captures src into dst, which must not exist. It runs while the
// container is frozen, so it does only what the capture needs, and stops
// when ctx ends.
func Take(ctx context.Context, src Source, dst string) (*Snapshot, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return nil, fmt.Errorf("creating snapshot parent: %w", err)
	}
	snap := &Snapshot{Kind: src.Kind, Path: dst}
	switch src.Kind {
	case KindBtrfs:
		out, err := exec.CommandContext(ctx, "btrfs", "subvolume", "snapshot", "-r", src.Root, dst).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("btrfs subvolume snapshot of %s: %v: %s", src.Root, err, strings.TrimSpace(string(out)))
		}
		return snap, nil
	case KindOverlay:
		snap.LowerDirs = slices.Clone(src.LowerDirs)
		stats, err := copyInto(ctx, verbatim, src.UpperDir, dst)
		snap.Stats = stats
		return snap, err
	case KindDir:
		stats, err := copyInto(ctx, verbatim, src.Root, dst)
		snap.Stats = stats
		return snap, err
	}
	return nil, fmt.Errorf("unknown root filesystem kind %q", src.Kind)
}

// copyInto creates dst with src's metadata and copies src's contents into it.
func copyInto(ctx context.Context, mode copyMode, src, dst string) (Stats, error) {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return Stats{}, fmt.Errorf("stat %s: %w", src, err)
	}
	if err := unix.Mkdir(dst, 0o700); err != nil {
		return Stats{}, fmt.Errorf("mkdir %s: %w", dst, err)
	}
	c := newCopier(mode)
	c.ctx = ctx
	if err := c.copyTree(src, dst); err != nil {
		return c.stats, err
	}
	return c.stats, c.copyMeta(src, dst, &st)
}

// CopyDir copies directory src into dst, which must not exist, with reflinks
// where the filesystem can: a volume's contents at the fork instant. Like
// Take, it runs while the source is frozen and stops when ctx ends.
func CopyDir(ctx context.Context, src, dst string) (Stats, error) {
	return copyInto(ctx, verbatim, src, dst)
}

// FillDir copies the contents and metadata of directory src into dst, an
// existing empty directory: a sibling's own volume. It refuses a dst that
// holds anything, which it would otherwise mix with or overwrite.
func FillDir(src, dst string) (Stats, error) {
	empty, err := isEmptyDir(dst)
	if err != nil {
		return Stats{}, err
	}
	if !empty {
		return Stats{}, fmt.Errorf("%s is not empty", dst)
	}
	c := newCopier(verbatim)
	if err := c.copyTree(src, dst); err != nil {
		return c.stats, err
	}
	return c.stats, c.copyRootMeta(src, dst)
}

// EmptyDir removes everything in dir, keeping dir: undoes FillDir.
func EmptyDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return clearDir(dir)
}

// IsEmptyDir reports whether dir is an empty directory.
func IsEmptyDir(dir string) (bool, error) { return isEmptyDir(dir) }

// ErrTargetNotEmpty is returned when a sibling's root holds files that are
// not the same image as the source's.
var ErrTargetNotEmpty = errors.New("sibling root is neither empty nor an overlay of the source's image")

// Fillable tells whether target may receive a snapshot at all: an empty
// directory, or an overlay mount (whose layers CheckTarget compares).
func Fillable(target string) error {
	if m, isMount, err := mountAt(target); err != nil {
		return fmt.Errorf("inspecting sibling root %s: %w", target, err)
	} else if isMount && m.FSType == "overlay" {
		return nil
	}
	empty, err := isEmptyDir(target)
	if err != nil {
		return fmt.Errorf("sibling root %s: %w", target, err)
	}
	if !empty {
		return fmt.Errorf("%w: %s has files in it; give the sibling an empty root directory", ErrTargetNotEmpty, target)
	}
	return nil
}

// CheckTarget tells whether target can receive the snapshot: an empty
// directory (a bare bundle), or an overlay mount of the same image layers as
// the source (a Podman sibling). It changes nothing, so a caller can refuse a
// sibling before anything is made for it.
func (s *Snapshot) CheckTarget(target string) (overlay bool, err error) {
	m, isMount, err := mountAt(target)
	if err != nil {
		return false, fmt.Errorf("inspecting sibling root %s: %w", target, err)
	}
	if isMount && m.FSType == "overlay" {
		layers, err := parseOverlayOpts(m.VFSOptions)
		if err != nil {
			return false, fmt.Errorf("sibling root %s: %w", target, err)
		}
		if s.Kind != KindOverlay || !sameLayers(layers.Lower, s.LowerDirs) {
			return false, fmt.Errorf("%w: %s is an overlay of other layers than the source's", ErrTargetNotEmpty, target)
		}
		return true, nil
	}
	empty, err := isEmptyDir(target)
	if err != nil {
		return false, fmt.Errorf("sibling root %s: %w", target, err)
	}
	if !empty {
		return false, fmt.Errorf("%w: %s has files in it; give the sibling an empty root directory", ErrTargetNotEmpty, target)
	}
	return false, nil
}

// sameLayers reports whether two lists name the same layer directories,
// however spelled: Podman's mounts name each layer by its short link
// (overlay/l/ID), its inspection by its path (overlay/ID/diff).
func sameLayers(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && resolved(a[i]) != resolved(b[i]) {
			return false
		}
	}
	return true
}

func resolved(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return filepath.Clean(path)
}

// Apply fills target, the sibling's root, from the snapshot. Target is either
// an empty directory (a bare bundle), or an overlay mount of the same image as
// the source (a Podman sibling), in which case only the source's own writes
// are applied on top.
func (s *Snapshot) Apply(target string) (Stats, error) {
	overlay, err := s.CheckTarget(target)
	if err != nil {
		return Stats{}, err
	}
	if overlay {
		c := newCopier(applyLayer)
		if err := c.copyTree(s.Path, target); err != nil {
			return c.stats, err
		}
		return c.stats, c.copyRootMeta(s.Path, target)
	}
	switch s.Kind {
	case KindBtrfs:
		if err := btrfsSnapshotInto(s.Path, target); err == nil {
			return Stats{}, nil
		}
		c := newCopier(verbatim)
		if err := c.copyTree(s.Path, target); err != nil {
			return c.stats, err
		}
		return c.stats, c.copyRootMeta(s.Path, target)
	case KindDir:
		c := newCopier(verbatim)
		if err := c.copyTree(s.Path, target); err != nil {
			return c.stats, err
		}
		return c.stats, c.copyRootMeta(s.Path, target)
	case KindOverlay:
		// A bare directory gets the whole image: the layers bottom up, then
		// the source's own writes.
		c := newCopier(applyLayer)
		for i := len(s.LowerDirs) - 1; i >= 0; i-- {
			if err := c.copyTree(s.LowerDirs[i], target); err != nil {
				return c.stats, err
			}
		}
		if err := c.copyTree(s.Path, target); err != nil {
			return c.stats, err
		}
		return c.stats, c.copyRootMeta(s.Path, target)
	}
	return Stats{}, fmt.Errorf("unknown snapshot kind %q", s.Kind)
}

// btrfsSnapshotInto replaces the empty directory target with a writable
// snapshot of the subvolume snap, when both are on the same btrfs.
func btrfsSnapshotInto(snap, target string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(target), &fs); err != nil || uint32(fs.Type) != btrfsSuperMagic {
		return errors.New("target is not on btrfs")
	}
	if err := os.Remove(target); err != nil {
		return err
	}
	out, err := exec.Command("btrfs", "subvolume", "snapshot", snap, target).CombinedOutput()
	if err != nil {
		// Put the directory back so the caller can fall back to a copy.
		os.Mkdir(target, 0o755)
		return fmt.Errorf("btrfs subvolume snapshot: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Clear undoes Apply on a bare directory target: it empties it again. An
// overlay target belongs to its owner (Podman), which discards its upper layer
// itself when the sibling is removed.
func Clear(target string) error {
	if m, isMount, err := mountAt(target); err == nil && isMount && m.FSType == "overlay" {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(target, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	var fs unix.Statfs_t
	if st.Ino == btrfsSubvolRootIno && unix.Statfs(target, &fs) == nil && uint32(fs.Type) == btrfsSuperMagic {
		out, err := exec.Command("btrfs", "subvolume", "delete", target).CombinedOutput()
		if err != nil {
			return fmt.Errorf("deleting subvolume %s: %v: %s", target, err, strings.TrimSpace(string(out)))
		}
		return os.Mkdir(target, 0o755)
	}
	return clearDir(target)
}

// Remove deletes the snapshot.
func (s *Snapshot) Remove() error {
	if s == nil || s.Path == "" {
		return nil
	}
	if _, err := os.Lstat(s.Path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if s.Kind == KindBtrfs {
		out, err := exec.Command("btrfs", "subvolume", "delete", s.Path).CombinedOutput()
		if err != nil {
			return fmt.Errorf("deleting snapshot subvolume %s: %v: %s", s.Path, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return os.RemoveAll(s.Path)
}

func isEmptyDir(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}
