package branch

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A tree of an archive is unpacked here, in Go, never by a tar program:
// every entry is made inside its tree's directory, through a descriptor of
// its parent opened with RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS, so no
// name, symlink or hard link in the archive reaches outside it.
//
// What a tree may hold is what a root filesystem capture or a volume copy
// holds, and no more: directories, regular files, symlinks, hard links to
// files of the same tree, FIFOs, and overlay whiteouts (character devices
// 0:0). Device nodes, set-user-ID and set-group-ID files and file
// capabilities (security.capability) are accepted only where TreeRules
// allows them (a start checks them against the branch's image). Of the
// trusted.* attributes only overlay's whiteout and opaque marks are kept;
// overlay's bookkeeping of the exporting host (origin, impure, nlink, uuid,
// protattr) is meaningless here and dropped; redirect and metacopy, which
// change what a file is, are refused, as is every other trusted.* or
// unknown attribute.

// maxTreeFileBytes bounds one file of a tree.
const maxTreeFileBytes = 1 << 40

// SpecialKind is what makes an entry special.
type SpecialKind string

const (
	SpecialSetID      SpecialKind = "set-user-ID or set-group-ID file"
	SpecialDevice     SpecialKind = "device node"
	SpecialCapability SpecialKind = "file capability (security.capability)"
)

// Special is an entry a tree holds only where its rules allow it.
type Special struct {
	Kind SpecialKind
	// Path is the entry's path in the tree, without a leading slash.
	Path string
	// Mode is the entry's type and mode bits (unix.S_IF* | permissions).
	Mode     uint32
	Uid, Gid int
	Rdev     uint64
	// Value is the security.capability attribute's value.
	Value []byte
}

// TreeRules decide the special entries of an imported tree.
type TreeRules struct {
	// Allow reports whether tree may hold s; nil allows none.
	Allow func(tree string, s Special) bool
}

func (r TreeRules) allow(tree string, s Special) error {
	if r.Allow != nil && r.Allow(tree, s) {
		return nil
	}
	return invalid("tree %s holds /%s, a %s that the branch's image does not have there", tree, s.Path, s.Kind)
}

type xattrRule int

const (
	xattrKeep xattrRule = iota
	xattrDrop
	xattrSpecial
	xattrRefuse
)

func classifyXattr(name string) xattrRule {
	switch {
	case name == "trusted.overlay.opaque", name == "trusted.overlay.whiteout", name == "trusted.overlay.whiteouts":
		return xattrKeep
	case name == "trusted.overlay.redirect", name == "trusted.overlay.metacopy":
		return xattrRefuse
	case strings.HasPrefix(name, "trusted.overlay."):
		return xattrDrop
	case strings.HasPrefix(name, "user."),
		name == "system.posix_acl_access", name == "system.posix_acl_default":
		return xattrKeep
	case name == "security.capability":
		return xattrSpecial
	case name == "security.selinux", name == "security.ima", name == "security.evm":
		// Labels and measurements of the exporting host: this host labels
		// the files itself.
		return xattrDrop
	}
	return xattrRefuse
}

const paxXattr = "SCHILY.xattr."

// extractor unpacks one tree.
type extractor struct {
	tree  string
	rules TreeRules
	root  int
	// kinds records every entry made, by path: a second entry for a path
	// is refused, and a hard link must name a regular file made before.
	kinds map[string]byte
	dirs  []*tar.Header // their metadata is set last, deepest first
	size  int64
	buf   []byte
}

// extractTree unpacks the tar stream r into the directory dst, which must
// exist and be empty, under the rules; it returns the bytes of the regular
// files it wrote.
func extractTree(r io.Reader, dst, tree string, rules TreeRules) (int64, error) {
	root, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", dst, err)
	}
	defer unix.Close(root)
	x := &extractor{tree: tree, rules: rules, root: root, kinds: map[string]byte{}, buf: make([]byte, 256<<10)}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.size, fmt.Errorf("%w: tree %s: %v", ErrInvalid, tree, err)
		}
		if err := x.entry(h, tr); err != nil {
			return x.size, err
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.dirMeta(x.dirs[i]); err != nil {
			return x.size, err
		}
	}
	return x.size, nil
}

// entryPath is h's path in the tree ("" for the tree's root), refused
// unless it is local.
func (x *extractor) entryPath(name string) (string, error) {
	p := path.Clean(strings.TrimPrefix(name, "./"))
	if p == "." || p == "" {
		return "", nil
	}
	if !filepath.IsLocal(p) || strings.ContainsRune(p, 0) {
		return "", invalid("tree %s holds entry %.200q, which leaves the tree", x.tree, name)
	}
	return p, nil
}

// how openat2 resolves every path of a tree.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func (x *extractor) open(p string, flags uint64) (int, error) {
	if p == "" {
		p = "."
	}
	fd, err := unix.Openat2(x.root, p, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: beneath})
	if err != nil {
		return -1, fmt.Errorf("%w: tree %s: opening %s inside it: %v", ErrInvalid, x.tree, p, err)
	}
	return fd, nil
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	p, err := x.entryPath(h.Name)
	if err != nil {
		return err
	}
	if h.Uid < 0 || h.Gid < 0 || h.Uid > 1<<32-2 || h.Gid > 1<<32-2 {
		return invalid("tree %s: /%s has owner %d:%d", x.tree, p, h.Uid, h.Gid)
	}
	if p == "" {
		if h.Typeflag != tar.TypeDir {
			return invalid("tree %s: its root is not a directory", x.tree)
		}
		x.dirs = append(x.dirs, h)
		return nil
	}
	if _, dup := x.kinds[p]; dup {
		return invalid("tree %s holds /%s twice", x.tree, p)
	}
	x.kinds[p] = h.Typeflag
	dir, base := path.Split(p)
	parent, err := x.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	mode := uint32(h.Mode) & 0o7777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(parent, base, 0o700); err != nil {
			return fmt.Errorf("tree %s: mkdir /%s: %w", x.tree, p, err)
		}
		x.dirs = append(x.dirs, h)
		return nil
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
		x.kinds[p] = tar.TypeReg
		return x.file(parent, base, p, h, r, mode)
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return invalid("tree %s: symlink /%s has no target", x.tree, p)
		}
		if err := x.noXattrs(p, h); err != nil {
			return err
		}
		if err := unix.Symlinkat(h.Linkname, parent, base); err != nil {
			return fmt.Errorf("tree %s: symlink /%s: %w", x.tree, p, err)
		}
		return x.linkMeta(parent, base, p, h)
	case tar.TypeLink:
		return x.hardLink(parent, base, p, h)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return x.node(parent, base, p, h, mode)
	}
	return invalid("tree %s: /%s has tar type %q, which no capture holds", x.tree, p, h.Typeflag)
}

// xattrs sorts an entry's attributes into those to set, refusing the
// ones a tree may not hold and checking a file capability.
func (x *extractor) xattrs(p string, h *tar.Header, mode uint32) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		switch classifyXattr(name) {
		case xattrDrop:
		case xattrKeep:
			out[name] = v
		case xattrSpecial:
			s := Special{Kind: SpecialCapability, Path: p, Mode: mode, Uid: h.Uid, Gid: h.Gid, Value: []byte(v)}
			if err := x.rules.allow(x.tree, s); err != nil {
				return nil, err
			}
			out[name] = v
		default:
			return nil, invalid("tree %s: /%s carries attribute %.100q, which a capture may not hold", x.tree, p, name)
		}
	}
	return out, nil
}

func (x *extractor) noXattrs(p string, h *tar.Header) error {
	attrs, err := x.xattrs(p, h, 0)
	if err != nil {
		return err
	}
	if len(attrs) > 0 {
		return invalid("tree %s: /%s is not a file or directory and carries attributes", x.tree, p)
	}
	return nil
}

func (x *extractor) file(parent int, base, p string, h *tar.Header, r io.Reader, mode uint32) error {
	if h.Size < 0 || h.Size > maxTreeFileBytes {
		return invalid("tree %s: /%s has size %d", x.tree, p, h.Size)
	}
	if mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		s := Special{Kind: SpecialSetID, Path: p, Mode: unix.S_IFREG | mode, Uid: h.Uid, Gid: h.Gid}
		if err := x.rules.allow(x.tree, s); err != nil {
			return err
		}
	}
	attrs, err := x.xattrs(p, h, unix.S_IFREG|mode)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("tree %s: creating /%s: %w", x.tree, p, err)
	}
	defer unix.Close(fd)
	n, err := x.copySparse(fd, io.LimitReader(r, h.Size))
	x.size += n
	if err == nil && n != h.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		err = unix.Ftruncate(fd, h.Size)
	}
	if err != nil {
		return fmt.Errorf("tree %s: writing /%s: %w", x.tree, p, err)
	}
	return x.fdMeta(fd, p, h, mode, attrs)
}

// copySparse writes r into fd, leaving every all-zero 4 KiB block a hole,
// as the capture was (a sparse file stays sparse).
func (x *extractor) copySparse(fd int, r io.Reader) (int64, error) {
	var off int64
	for {
		n, err := io.ReadFull(r, x.buf)
		data := x.buf[:n]
		for i := 0; i < len(data); i += pageSize {
			block := data[i:min(i+pageSize, len(data))]
			if allZero(block) {
				continue
			}
			if _, werr := unix.Pwrite(fd, block, off+int64(i)); werr != nil {
				return off, werr
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

var zeroBlock = make([]byte, pageSize)

func allZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// fdMeta gives an open file or directory its owner, mode, attributes and
// times, in that order: chown clears set-ID bits, and every other change
// moves ctime, not mtime.
func (x *extractor) fdMeta(fd int, p string, h *tar.Header, mode uint32, attrs map[string]string) error {
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("tree %s: chown /%s: %w", x.tree, p, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("tree %s: chmod /%s: %w", x.tree, p, err)
	}
	for name, v := range attrs {
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			return fmt.Errorf("tree %s: setting %s on /%s: %w", x.tree, name, p, err)
		}
	}
	return setTimes(fd, h)
}

// setTimes sets the times of the inode fd holds (any kind of descriptor,
// O_PATH included) through its /proc/self/fd link: utimensat(2) takes no
// empty path.
func setTimes(fd int, h *tar.Header) error {
	ts := []unix.Timespec{unix.NsecToTimespec(h.AccessTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if h.AccessTime.IsZero() {
		ts[0] = ts[1]
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), ts, 0)
}

func (x *extractor) linkMeta(parent int, base, p string, h *tar.Header) error {
	if err := unix.Fchownat(parent, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("tree %s: chown /%s: %w", x.tree, p, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	return unix.UtimesNanoAt(parent, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func (x *extractor) hardLink(parent int, base, p string, h *tar.Header) error {
	target, err := x.entryPath(h.Linkname)
	if err != nil {
		return err
	}
	if target == "" || x.kinds[target] != tar.TypeReg {
		return invalid("tree %s: /%s is a hard link to %.200q, which is no file of the tree made before it", x.tree, p, h.Linkname)
	}
	x.kinds[p] = tar.TypeLink
	dir, tbase := path.Split(target)
	tparent, err := x.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(tparent)
	if err := unix.Linkat(tparent, tbase, parent, base, 0); err != nil {
		return fmt.Errorf("tree %s: linking /%s to /%s: %w", x.tree, p, target, err)
	}
	return nil
}

func (x *extractor) node(parent int, base, p string, h *tar.Header, mode uint32) error {
	var kind uint32
	switch h.Typeflag {
	case tar.TypeChar:
		kind = unix.S_IFCHR
	case tar.TypeBlock:
		kind = unix.S_IFBLK
	default:
		kind = unix.S_IFIFO
	}
	rdev := unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor))
	whiteout := kind == unix.S_IFCHR && rdev == 0
	if h.Devmajor < 0 || h.Devminor < 0 || h.Devmajor > 1<<20 || h.Devminor > 1<<20 {
		return invalid("tree %s: /%s is device %d:%d", x.tree, p, h.Devmajor, h.Devminor)
	}
	if kind != unix.S_IFIFO && !whiteout {
		s := Special{Kind: SpecialDevice, Path: p, Mode: kind | mode, Uid: h.Uid, Gid: h.Gid, Rdev: rdev}
		if err := x.rules.allow(x.tree, s); err != nil {
			return err
		}
	}
	if mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return invalid("tree %s: /%s is a node with set-ID bits", x.tree, p)
	}
	if err := x.noXattrs(p, h); err != nil {
		return err
	}
	if err := unix.Mknodat(parent, base, kind|0o600, int(rdev)); err != nil {
		return fmt.Errorf("tree %s: mknod /%s: %w", x.tree, p, err)
	}
	fd, err := unix.Openat(parent, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tree %s: opening /%s: %w", x.tree, p, err)
	}
	defer unix.Close(fd)
	// An O_PATH descriptor takes neither fchown nor fchmod: its
	// /proc/self/fd link names this very inode.
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Fchownat(unix.AT_FDCWD, proc, h.Uid, h.Gid, 0); err != nil {
		return fmt.Errorf("tree %s: chown /%s: %w", x.tree, p, err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, proc, mode, 0); err != nil {
		return fmt.Errorf("tree %s: chmod /%s: %w", x.tree, p, err)
	}
	return setTimes(fd, h)
}

func (x *extractor) dirMeta(h *tar.Header) error {
	p, _ := x.entryPath(h.Name)
	mode := uint32(h.Mode) & 0o7777
	if mode&unix.S_ISUID != 0 {
		return invalid("tree %s: directory /%s is set-user-ID", x.tree, p)
	}
	attrs, err := x.xattrs(p, h, unix.S_IFDIR|mode)
	if err != nil {
		return err
	}
	fd, err := x.open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return x.fdMeta(fd, p, h, mode, attrs)
}
