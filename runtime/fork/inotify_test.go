package fork

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/test/testenv"
)

func TestParseWatches(t *testing.T) {
	fdinfo := `pos:	0
flags:	02004000
mnt_id:	17
ino:	12
inotify wd:1 ino:984381 sdev:3b mask:2 ignored_mask:0 fhandle-bytes:20 fhandle-type:f8 f_handle:0000
inotify wd:2 ino:a sdev:fe00000 mask:2 ignored_mask:0
fanotify ino:1f sdev:3b mflags:0 mask:1 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:00
fanotify mnt_id:42 mflags:0 mask:1 ignored_mask:0
`
	got := map[watchedInode]bool{}
	parseWatches(bufio.NewScanner(strings.NewReader(fdinfo)), got)
	want := []watchedInode{{0x3b, 0x984381}, {0xfe00000, 0xa}, {0x3b, 0x1f}}
	if len(got) != len(want) {
		t.Fatalf("parsed %v, want %v", got, want)
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("missing %+v in %v", w, got)
		}
	}
}

func statInode(t *testing.T, path string) watchedInode {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return watchedInode{dev: kernelDev(st.Dev), ino: st.Ino}
}

// Watched files and directories are found by inode and named as the tree
// sees them, from its root.
func TestFindInodes(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "srv/app/src"), 0o755)
	os.WriteFile(filepath.Join(root, "srv/app/src/main.go"), nil, 0o644)
	os.WriteFile(filepath.Join(root, "srv/other"), nil, 0o644)
	file, dir := statInode(t, filepath.Join(root, "srv/app/src/main.go")), statInode(t, filepath.Join(root, "srv/app"))
	gone := watchedInode{dev: file.dev, ino: 1<<62 + 5}
	watched := map[watchedInode]bool{file: true, dir: true, gone: true}
	found := findInodes(root+"/", watched, time.Now().Add(time.Minute))
	paths := map[string]uint64{}
	for _, e := range found {
		paths[e.Path] = e.Inode
	}
	if len(found) != 2 || paths["/srv/app/src/main.go"] != file.ino || paths["/srv/app"] != dir.ino {
		t.Fatalf("found %+v", found)
	}
	if !watched[gone] || len(watched) != 1 {
		t.Fatalf("left to find: %v", watched)
	}
	if found := findInodes(root+"/", map[watchedInode]bool{gone: true}, time.Now().Add(-time.Second)); len(found) != 0 {
		t.Fatalf("a walk past its deadline found %v", found)
	}
}

// The watches of a live process are read from its fdinfo.
func TestWatchedInodesOfAProcess(t *testing.T) {
	dir := t.TempDir()
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		testenv.Missing(t, "no inotify: %v", err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	pids := procfs.Tree(os.Getpid())
	if pids[0] != os.Getpid() {
		t.Fatalf("tree %v", pids)
	}
	got, err := watchedInodes(pids[:1])
	if err != nil {
		t.Fatal(err)
	}
	if w := statInode(t, dir); !got[w] {
		t.Fatalf("watch on %s (%+v) not found in %v", dir, w, got)
	}
}
