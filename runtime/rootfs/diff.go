package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A layer diff is how Podman's checkpoints carry a container's root
// filesystem changes (rootfs-diff.tar and deleted.files): a tar of what was
// added or changed, applied over the image, then a list of paths to remove.
// An overlay capture holds the same changes as an upper layer, with
// whiteouts and opaque directories; WriteLayerDiff turns one into the other
// and LayerFromDiff back.

// WriteLayerDiff writes to tw the files of the overlay upper layer upper
// (an overlay capture), and returns the paths it deletes from the layers
// below, lowers (top first), absolute in the container ("/etc/x"). An
// opaque directory's hidden entries are listed one by one (the diff is
// applied before deletions, so listing the directory itself would remove
// what the tar put back). Overlay's own extended attributes are left out.
func WriteLayerDiff(upper string, lowers []string, tw *tar.Writer) ([]string, error) {
	d := layerDiff{upper: upper, lowers: lowers, tw: tw, links: map[uint64]string{}}
	if err := d.dir("", false); err != nil {
		return nil, err
	}
	return d.deleted, nil
}

type layerDiff struct {
	upper   string
	lowers  []string
	tw      *tar.Writer
	deleted []string
	// links maps an inode already written to its name, so that hard
	// links stay links.
	links map[uint64]string
}

// dir writes the entries of the upper layer's directory rel. hiding is set
// inside an opaque directory: whatever the lower layers hold there is gone.
func (d *layerDiff) dir(rel string, hiding bool) error {
	full := filepath.Join(d.upper, rel)
	entries, err := os.ReadDir(full)
	if err != nil {
		return fmt.Errorf("reading %s: %w", full, err)
	}
	if rel != "" && isOpaque(full) {
		hiding = true
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if hiding {
		for _, n := range d.lowerNames(rel) {
			if !slices.Contains(names, n) {
				d.deleted = append(d.deleted, "/"+path.Join(rel, n))
			}
		}
	}
	for _, n := range names {
		if err := d.entry(path.Join(rel, n), hiding); err != nil {
			return err
		}
	}
	return nil
}

func (d *layerDiff) entry(rel string, hiding bool) error {
	full := filepath.Join(d.upper, rel)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return fmt.Errorf("stat %s: %w", full, err)
	}
	if isWhiteout(full, &st) {
		if !hiding {
			d.deleted = append(d.deleted, "/"+rel)
		}
		return nil
	}
	if _, err := getXattr(full, "trusted.overlay.redirect"); err == nil {
		return fmt.Errorf("%s is a renamed directory (overlay redirect_dir), which a layer diff cannot carry", "/"+rel)
	}
	fi, err := os.Lstat(full)
	if err != nil {
		return err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(full); err != nil {
			return err
		}
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", full, err)
	}
	h.Name = rel
	h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
	h.Format = tar.FormatPAX
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
		if first, ok := d.links[st.Ino]; ok {
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
		} else {
			d.links[st.Ino] = rel
		}
	}
	if h.Typeflag == tar.TypeDir {
		h.Name += "/"
	}
	if err := d.xattrs(full, h); err != nil {
		return err
	}
	if err := d.tw.WriteHeader(h); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeReg:
		f, err := os.Open(full)
		if err != nil {
			return err
		}
		_, err = io.CopyN(d.tw, f, h.Size)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", full, err)
		}
	case tar.TypeDir:
		return d.dir(rel, hiding)
	}
	return nil
}

// xattrs carries the entry's extended attributes but overlay's own.
func (d *layerDiff) xattrs(full string, h *tar.Header) error {
	names, err := listXattrs(full)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, "trusted.overlay.") || strings.HasPrefix(n, "user.overlay.") {
			continue
		}
		v, err := getXattr(full, n)
		if err != nil {
			return err
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+n] = string(v)
	}
	return nil
}

// lowerNames are the names the lower layers show in directory rel, as
// overlay merges them: a higher layer's whiteout hides a name, and an
// opaque directory hides the layers below it.
func (d *layerDiff) lowerNames(rel string) []string {
	var names, gone []string
	for _, l := range d.lowers {
		dir := filepath.Join(l, rel)
		entries, err := os.ReadDir(dir)
		if err != nil {
			// Not a directory in this layer: nothing of it shows.
			continue
		}
		for _, e := range entries {
			n := e.Name()
			if slices.Contains(names, n) || slices.Contains(gone, n) {
				continue
			}
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(dir, n), &st) == nil && isWhiteout(filepath.Join(dir, n), &st) {
				gone = append(gone, n)
				continue
			}
			names = append(names, n)
		}
		if isOpaque(dir) {
			break
		}
	}
	return names
}

// LayerFromDiff makes dst, which must not exist, an overlay upper layer
// holding the changes of a layer diff: the tar read from r, and a whiteout
// for every deleted path. Entries that would leave dst (absolute names,
// "..", links out) are refused, as are device nodes other than whiteouts:
// a diff is untrusted input.
func LayerFromDiff(r io.Reader, deleted []string, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the root filesystem diff: %w", err)
		}
		if err := extractEntry(root, dst, h, tr); err != nil {
			return fmt.Errorf("root filesystem diff entry %q: %w", h.Name, err)
		}
	}
	for _, p := range deleted {
		rel := strings.TrimPrefix(path.Clean("/"+p), "/")
		if rel == "" || !filepath.IsLocal(rel) {
			return fmt.Errorf("deleted path %q: not a path in the container", p)
		}
		if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("deleted path %q: %w", p, err)
		}
		if _, err := root.Lstat(rel); err == nil {
			// Deleted after being changed: the change never shows.
			if err := root.RemoveAll(rel); err != nil {
				return err
			}
		}
		if err := unix.Mknod(filepath.Join(dst, rel), unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("deleted path %q: %w", p, err)
		}
	}
	return nil
}

func extractEntry(root *os.Root, dst string, h *tar.Header, r io.Reader) error {
	rel := path.Clean(strings.TrimPrefix(h.Name, "./"))
	if rel == "." {
		return nil
	}
	if !filepath.IsLocal(rel) {
		return errors.New("not a path inside the root filesystem")
	}
	mode := fs.FileMode(h.Mode).Perm() | fs.FileMode(h.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg:
		f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := root.Symlink(h.Linkname, rel); err != nil {
			return err
		}
		// A symlink's owner is its own; the mode of one means nothing.
		return root.Lchown(rel, h.Uid, h.Gid)
	case tar.TypeLink:
		target := path.Clean(strings.TrimPrefix(h.Linkname, "./"))
		if !filepath.IsLocal(target) {
			return fmt.Errorf("hard link to %q, outside the root filesystem", h.Linkname)
		}
		return root.Link(target, rel)
	case tar.TypeFifo:
		if err := unix.Mkfifo(filepath.Join(dst, rel), 0o600); err != nil {
			return err
		}
	default:
		return fmt.Errorf("entry type %q is not allowed in a root filesystem diff", h.Typeflag)
	}
	if err := root.Lchown(rel, h.Uid, h.Gid); err != nil {
		return err
	}
	if err := root.Chmod(rel, mode); err != nil {
		return err
	}
	return root.Chtimes(rel, h.AccessTime, h.ModTime)
}
