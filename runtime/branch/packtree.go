package branch

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// packTree writes directory dir as a tar stream (PAX): directories,
// regular files, symlinks, hard links, device nodes (overlay's whiteouts)
// and FIFOs, with numeric owners, modes, times and extended attributes, in
// the order extractTree reads them back (a directory before its entries).
// Sockets are left out, as the captures leave them out.
func packTree(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	var walk func(rel string) error
	walk = func(rel string) error {
		full := filepath.Join(dir, rel)
		var st unix.Stat_t
		if err := unix.Lstat(full, &st); err != nil {
			return fmt.Errorf("packing %s: %w", full, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			return nil
		}
		h, err := tarHeader(full, rel, &st)
		if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				h = &tar.Header{Name: h.Name, Typeflag: tar.TypeLink, Linkname: first, Format: tar.FormatPAX}
			} else {
				links[key] = h.Name
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("packing %s: %w", full, err)
		}
		switch {
		case h.Typeflag == tar.TypeReg:
			if err := copyFileInto(tw, full, h.Size); err != nil {
				return err
			}
		case h.Typeflag == tar.TypeDir:
			names, err := readDirNames(full)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := walk(filepath.Join(rel, n)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		return err
	}
	return tw.Close()
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}

func copyFileInto(w io.Writer, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(w, f, size); err != nil {
		return fmt.Errorf("packing %s: %w", path, err)
	}
	return nil
}

func tarHeader(full, rel string, st *unix.Stat_t) (*tar.Header, error) {
	h := &tar.Header{
		Name:       filepath.ToSlash(rel),
		Mode:       int64(st.Mode & 0o7777),
		Uid:        int(st.Uid),
		Gid:        int(st.Gid),
		ModTime:    time.Unix(st.Mtim.Unix()),
		AccessTime: time.Unix(st.Atim.Unix()),
		Format:     tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
		if rel != "." {
			h.Name += "/"
		}
	case unix.S_IFREG:
		h.Typeflag, h.Size = tar.TypeReg, st.Size
	case unix.S_IFLNK:
		target, err := os.Readlink(full)
		if err != nil {
			return nil, err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK:
		h.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	default:
		return nil, fmt.Errorf("packing %s: unsupported file type %#o", full, st.Mode&unix.S_IFMT)
	}
	attrs, err := listXattrs(full)
	if err != nil {
		return nil, err
	}
	for k, v := range attrs {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords[paxXattr+k] = v
	}
	return h, nil
}

// listXattrs reads path's extended attributes without following a
// symlink.
func listXattrs(path string) (map[string]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(path, buf); err != nil {
		return nil, fmt.Errorf("listing the attributes of %s: %w", path, err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		n, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, fmt.Errorf("reading attribute %s of %s: %w", name, path, err)
		}
		val := make([]byte, n)
		if n, err = unix.Lgetxattr(path, name, val); err != nil {
			return nil, fmt.Errorf("reading attribute %s of %s: %w", name, path, err)
		}
		out[name] = string(val[:n])
	}
	return out, nil
}
