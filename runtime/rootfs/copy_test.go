package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/tclone/tclone/test/testenv"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "whiteouts are device nodes, and trusted.* xattrs need CAP_SYS_ADMIN")
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func whiteout(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
}

func setXattr(t *testing.T, path, name, value string) {
	t.Helper()
	if err := unix.Lsetxattr(path, name, []byte(value), 0); err != nil {
		t.Fatalf("setxattr %s on %s: %v", name, path, err)
	}
}

func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

func lstat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A verbatim copy of an overlay upper layer is itself a valid upper layer:
// whiteouts, opaque markers, links, owners, modes and times survive.
func TestVerbatimCopyKeepsEverything(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	write(t, filepath.Join(src, "etc/conf"), "hello", 0o640)
	os.Chown(filepath.Join(src, "etc/conf"), 1000, 1001)
	write(t, filepath.Join(src, "bin/tool"), "#!/bin/sh\n", 0o755)
	unix.Chmod(filepath.Join(src, "bin/tool"), 0o4755)
	os.Link(filepath.Join(src, "etc/conf"), filepath.Join(src, "etc/conf.link"))
	os.Symlink("../etc/conf", filepath.Join(src, "bin/conf"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o600)
	whiteout(t, filepath.Join(src, "etc/deleted"))
	os.Mkdir(filepath.Join(src, "opaque"), 0o755)
	setXattr(t, filepath.Join(src, "opaque"), "trusted.overlay.opaque", "y")
	setXattr(t, filepath.Join(src, "etc/conf"), "user.note", "kept")
	mtime := unix.NsecToTimespec(1_600_000_000_123_456_789)
	unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(src, "etc/conf"), []unix.Timespec{mtime, mtime}, 0)
	// A unix socket is only a name; it is not copied.
	fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(src, "sock")})
	unix.Close(fd)

	dst := filepath.Join(t.TempDir(), "snap")
	stats, err := copyInto(context.Background(), verbatim, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bin", "bin/conf", "bin/tool", "etc", "etc/conf", "etc/conf.link", "etc/deleted", "fifo", "opaque"}
	if got := tree(t, dst); !equal(got, want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	conf := lstat(t, filepath.Join(dst, "etc/conf"))
	if conf.Uid != 1000 || conf.Gid != 1001 || conf.Mode&0o7777 != 0o640 || conf.Mtim != mtime {
		t.Errorf("etc/conf metadata: uid %d gid %d mode %o mtime %v", conf.Uid, conf.Gid, conf.Mode&0o7777, conf.Mtim)
	}
	if link := lstat(t, filepath.Join(dst, "etc/conf.link")); link.Ino != conf.Ino {
		t.Error("hard link became a separate file")
	}
	if m := lstat(t, filepath.Join(dst, "bin/tool")).Mode & 0o7777; m != 0o4755 {
		t.Errorf("setuid tool mode %o", m)
	}
	if st := lstat(t, filepath.Join(dst, "etc/deleted")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Error("whiteout is not a 0/0 character device")
	}
	if v, err := getXattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Errorf("opaque marker lost: %q %v", v, err)
	}
	if v, err := getXattr(filepath.Join(dst, "etc/conf"), "user.note"); err != nil || string(v) != "kept" {
		t.Errorf("user xattr lost: %q %v", v, err)
	}
	if target, _ := os.Readlink(filepath.Join(dst, "bin/conf")); target != "../etc/conf" {
		t.Errorf("symlink target %q", target)
	}
	if stats.Whiteouts != 1 || stats.Bytes != int64(len("hello")+len("#!/bin/sh\n")) {
		t.Errorf("stats %+v", stats)
	}
}

// Applying a layer interprets it: whiteouts delete, opaque directories
// replace, and overlay's private xattrs stay behind.
func TestApplyLayerSemantics(t *testing.T) {
	needRoot(t)
	target := t.TempDir()
	write(t, filepath.Join(target, "keep"), "old", 0o644)
	write(t, filepath.Join(target, "gone"), "x", 0o644)
	write(t, filepath.Join(target, "dir/a"), "a", 0o644)
	write(t, filepath.Join(target, "wasdir/inner"), "i", 0o644)
	write(t, filepath.Join(target, "changed"), "old content", 0o644)

	layer := t.TempDir()
	whiteout(t, filepath.Join(layer, "gone"))
	os.Mkdir(filepath.Join(layer, "dir"), 0o755)
	setXattr(t, filepath.Join(layer, "dir"), "trusted.overlay.opaque", "y")
	write(t, filepath.Join(layer, "dir/b"), "b", 0o644)
	write(t, filepath.Join(layer, "wasdir"), "now a file", 0o644)
	write(t, filepath.Join(layer, "changed"), "new", 0o600)
	// An empty file with the whiteout xattr is overlay's other whiteout.
	write(t, filepath.Join(layer, "keep2"), "", 0o644)
	write(t, filepath.Join(target, "keep2"), "should go", 0o644)
	setXattr(t, filepath.Join(layer, "keep2"), "trusted.overlay.whiteout", "y")

	c := newCopier(applyLayer)
	if err := c.copyTree(layer, target); err != nil {
		t.Fatal(err)
	}
	want := []string{"changed", "dir", "dir/b", "keep", "wasdir"}
	if got := tree(t, target); !equal(got, want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	if data, _ := os.ReadFile(filepath.Join(target, "changed")); string(data) != "new" {
		t.Errorf("changed = %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(target, "wasdir")); string(data) != "now a file" {
		t.Errorf("wasdir = %q", data)
	}
	if _, err := getXattr(filepath.Join(target, "dir"), "trusted.overlay.opaque"); err == nil {
		t.Error("overlay's opaque xattr leaked into the applied tree")
	}
	if c.stats.Whiteouts != 2 {
		t.Errorf("whiteouts %d, want 2", c.stats.Whiteouts)
	}
}

// A bare directory sibling of an overlay source gets the merged view: image
// layers bottom up, then the source's own writes.
func TestApplyOverlaySnapshotToEmptyDir(t *testing.T) {
	needRoot(t)
	lowerBottom, lowerTop, upper := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, filepath.Join(lowerBottom, "a"), "a", 0o644)
	write(t, filepath.Join(lowerBottom, "b"), "b", 0o644)
	whiteout(t, filepath.Join(lowerTop, "b"))
	write(t, filepath.Join(lowerTop, "c"), "c", 0o644)
	write(t, filepath.Join(upper, "d"), "d", 0o644)
	whiteout(t, filepath.Join(upper, "c"))

	snap, err := Take(context.Background(), Source{Kind: KindOverlay, LowerDirs: []string{lowerTop, lowerBottom}, UpperDir: upper}, filepath.Join(t.TempDir(), "snap"))
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if _, err := snap.Apply(target); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, target), []string{"a", "d"}; !equal(got, want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	if err := Clear(target); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, target); len(got) != 0 {
		t.Fatalf("Clear left %v", got)
	}
}

func TestApplyRefusesNonEmptyTarget(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	write(t, filepath.Join(src, "f"), "x", 0o644)
	snap, err := Take(context.Background(), Source{Kind: KindDir, Root: src}, filepath.Join(t.TempDir(), "snap"))
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	write(t, filepath.Join(target, "other"), "y", 0o644)
	if _, err := snap.Apply(target); err == nil {
		t.Fatal("applied a snapshot over unrelated files")
	}
	if data, _ := os.ReadFile(filepath.Join(target, "other")); string(data) != "y" {
		t.Fatal("refused apply touched the target")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A sparse file costs its data, not its size, and keeps its holes.
func TestSparseFileStaysSparse(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 30)
	f.WriteAt([]byte("middle"), 512<<20)
	f.Close()
	dst := filepath.Join(t.TempDir(), "snap")
	if _, err := copyInto(context.Background(), verbatim, src, dst); err != nil {
		t.Fatal(err)
	}
	st := lstat(t, filepath.Join(dst, "sparse"))
	if st.Size != 1<<30 {
		t.Fatalf("size %d", st.Size)
	}
	if st.Blocks*512 > 16<<20 {
		t.Fatalf("the copy allocates %d bytes for 6 bytes of data", st.Blocks*512)
	}
	got := make([]byte, 6)
	g, _ := os.Open(filepath.Join(dst, "sparse"))
	g.ReadAt(got, 512<<20)
	g.Close()
	if string(got) != "middle" {
		t.Fatalf("data %q", got)
	}
}

// A snapshot past its deadline stops instead of holding the source frozen.
func TestTakeStopsWhenCancelled(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "a"), "x", 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Take(ctx, Source{Kind: KindDir, Root: src}, filepath.Join(t.TempDir(), "snap")); err == nil {
		t.Fatal("a cancelled snapshot completed")
	}
}
