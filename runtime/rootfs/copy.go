package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Stats counts what a copy moved.
type Stats struct {
	Files          int   `json:"files"`
	Dirs           int   `json:"dirs"`
	Bytes          int64 `json:"bytes"`           // regular file bytes written
	ReflinkedBytes int64 `json:"reflinked_bytes"` // of Bytes, shared by reflink instead of copied
	Whiteouts      int   `json:"whiteouts"`
}

// copyMode says how overlay metadata in the source is treated.
type copyMode int

const (
	// verbatim reproduces the tree exactly, whiteouts and overlay xattrs
	// included: the copy is itself a valid overlay upper layer.
	verbatim copyMode = iota
	// applyLayer interprets the source as an overlay layer and applies it
	// on top of the destination: whiteouts delete, opaque directories replace,
	// and overlay's private xattrs are not carried over.
	applyLayer
)

const (
	xattrOverlayPrefix  = "trusted.overlay."
	xattrOpaque         = "trusted.overlay.opaque"
	xattrWhiteout       = "trusted.overlay.whiteout"
	xattrUserOverlayPfx = "user.overlay."
)

type inodeKey struct{ dev, ino uint64 }

// copier copies one tree. It remembers hard links so they stay links.
type copier struct {
	// ctx, when set, ends a copy that must not run on (a snapshot in the
	// source's frozen window past its deadline).
	ctx   context.Context
	mode  copyMode
	links map[inodeKey]string
	stats Stats
	// noReflink is set after the first reflink refusal so later files do not
	// try again on a filesystem that cannot do it.
	noReflink bool
}

func newCopier(mode copyMode) *copier {
	return &copier{mode: mode, links: map[inodeKey]string{}}
}

// copyTree copies the contents of directory src into directory dst, which
// must exist.
func (c *copier) copyTree(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	for _, e := range entries {
		if err := c.copyEntry(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) copyEntry(src, dst string) error {
	if c.ctx != nil && c.ctx.Err() != nil {
		return fmt.Errorf("copying %s: %w", src, c.ctx.Err())
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if c.mode == applyLayer && isWhiteout(src, &st) {
		c.stats.Whiteouts++
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("applying whiteout %s: %w", dst, err)
		}
		return nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return c.copyDir(src, dst, &st)
	case unix.S_IFSOCK:
		// A socket inode is only a name; whoever owns it (CRIU, restoring a
		// listening unix socket) binds a fresh one.
		return nil
	}
	if c.mode == applyLayer {
		if err := removeNonDir(dst); err != nil {
			return err
		}
	}
	if st.Nlink > 1 {
		key := inodeKey{uint64(st.Dev), st.Ino}
		if first, ok := c.links[key]; ok {
			if err := os.Link(first, dst); err != nil {
				return fmt.Errorf("linking %s to %s: %w", dst, first, err)
			}
			return nil
		}
		c.links[key] = dst
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := c.copyFile(src, dst, &st); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", src, err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("symlink %s: %w", dst, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
		if isDevice00(&st) {
			c.stats.Whiteouts++
		}
	default:
		return fmt.Errorf("%s: unsupported file type %#o", src, st.Mode&unix.S_IFMT)
	}
	c.stats.Files++
	return c.copyMeta(src, dst, &st)
}

func (c *copier) copyDir(src, dst string, st *unix.Stat_t) error {
	opaque := c.mode == applyLayer && isOpaque(src)
	var dst0 unix.Stat_t
	err := unix.Lstat(dst, &dst0)
	switch {
	case err == nil && dst0.Mode&unix.S_IFMT == unix.S_IFDIR:
		if opaque {
			if err := clearDir(dst); err != nil {
				return err
			}
		}
	case err == nil:
		if err := os.Remove(dst); err != nil {
			return fmt.Errorf("replacing %s with a directory: %w", dst, err)
		}
		fallthrough
	case errors.Is(err, unix.ENOENT):
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("mkdir %s: %w", dst, err)
		}
	default:
		return fmt.Errorf("stat %s: %w", dst, err)
	}
	c.stats.Dirs++
	if err := c.copyTree(src, dst); err != nil {
		return err
	}
	// Metadata last: creating children changes the directory's mtime.
	return c.copyMeta(src, dst, st)
}

// copyRootMeta gives the target root the captured root's owner, mode, xattrs
// and times: CRIU checks the mode of the root it restores into against the
// one it dumped.
func (c *copier) copyRootMeta(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	return c.copyMeta(src, dst, &st)
}

// copyFile shares the data by reflink where the filesystem can, else copies it
// in the kernel.
func (c *copier) copyFile(src, dst string, st *unix.Stat_t) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	defer out.Close()
	c.stats.Bytes += st.Size
	if st.Size == 0 {
		return nil
	}
	if !c.noReflink {
		err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		if err == nil {
			c.stats.ReflinkedBytes += st.Size
			return nil
		}
		c.noReflink = true
	}
	if err := copySparse(in, out, st.Size); err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return nil
}

// copySparse copies only the data extents of in, so a sparse file (a
// container's "truncate -s 1T") costs its data, not its size; the holes stay
// holes.
func copySparse(in, out *os.File, size int64) error {
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA on this filesystem: everything is data.
			data = off
		}
		hole := size
		if err == nil {
			if h, herr := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE); herr == nil {
				hole = h
			}
		}
		if hole > size {
			hole = size
		}
		if err := copyExtent(in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyExtent copies length bytes at offset, in the kernel where it can.
func copyExtent(in, out *os.File, offset, length int64) error {
	roff, woff := offset, offset
	for length > 0 {
		n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(length, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				_, err := io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, length))
				return err
			}
			return err
		}
		if n == 0 {
			// The file shrank under us; what we have is the file.
			return nil
		}
		length -= int64(n)
	}
	return nil
}

// copyMeta sets owner, mode, extended attributes and times, in the order that
// keeps each from undoing the others (chown clears set-id bits).
func (c *copier) copyMeta(src, dst string, st *unix.Stat_t) error {
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	if err := c.copyXattrs(src, dst); err != nil {
		return err
	}
	if !isLink {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times of %s: %w", dst, err)
	}
	return nil
}

func (c *copier) copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return fmt.Errorf("listing xattrs of %s: %w", src, err)
	}
	for _, name := range names {
		if c.mode == applyLayer && (strings.HasPrefix(name, xattrOverlayPrefix) || strings.HasPrefix(name, xattrUserOverlayPfx)) {
			continue
		}
		val, err := getXattr(src, name)
		if err != nil {
			return fmt.Errorf("reading xattr %s of %s: %w", name, src, err)
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			// Some targets cannot hold some namespaces (trusted.* on a
			// filesystem without it, security.* under an LSM that refuses);
			// those are lost, everything else is an error.
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) && strings.HasPrefix(name, "security.") {
				continue
			}
			return fmt.Errorf("setting xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	if size == 0 {
		return nil, nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Split(string(buf[:size]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names, nil
}

func getXattr(path, name string) ([]byte, error) {
	size, err := unix.Lgetxattr(path, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	size, err = unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:size], nil
}

func isDevice00(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// isWhiteout recognises both whiteout forms overlayfs writes: a 0/0 character
// device, and (for unprivileged or nested overlays) an empty file carrying the
// whiteout xattr.
func isWhiteout(path string, st *unix.Stat_t) bool {
	if isDevice00(st) {
		return true
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == 0 {
		if _, err := getXattr(path, xattrWhiteout); err == nil {
			return true
		}
	}
	return false
}

// IsOpaqueDir reports whether dir, in an overlay upper layer, hides the
// lower layers' contents.
func IsOpaqueDir(dir string) bool { return isOpaque(dir) }

func isOpaque(dir string) bool {
	v, err := getXattr(dir, xattrOpaque)
	return err == nil && string(v) == "y"
}

func removeNonDir(path string) error {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clearing opaque directory %s: %w", dir, err)
		}
	}
	return nil
}
