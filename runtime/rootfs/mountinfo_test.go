package rootfs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// mountIn finds the topmost mount at path in a mountinfo text, the way
// mountAt does in the process's own.
func mountIn(t *testing.T, mountinfoText, path string) *mountinfo.Info {
	t.Helper()
	m, err := topmost(mountinfo.GetMountsFromReader(strings.NewReader(mountinfoText), at(path)))
	if err != nil || m == nil {
		t.Fatalf("no mount at %s: %v", path, err)
	}
	return m
}

func TestOverlayMount(t *testing.T) {
	merged := "/var/lib/containers/storage/overlay/8a85/merged"
	m := mountIn(t, `47 43 0:40 / `+merged+` rw - tmpfs tmpfs rw
48 47 0:41 / `+merged+` rw,nodev,relatime shared:5 - overlay overlay rw,lowerdir=/l/A:/l/B,upperdir=/o/8a85/diff,workdir=/o/8a85/work,uuid=on
49 43 0:42 / /other rw - overlay overlay rw,lowerdir=/x,upperdir=/y,workdir=/z
`, merged)
	if m.FSType != "overlay" {
		t.Fatalf("not the topmost mount: %+v", m)
	}
	l, err := parseOverlayOpts(m.VFSOptions)
	if err != nil {
		t.Fatal(err)
	}
	want := overlayLayers{Lower: []string{"/l/A", "/l/B"}, Upper: "/o/8a85/diff"}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("got %+v want %+v", l, want)
	}
}

func TestMountinfoEscapes(t *testing.T) {
	if m := mountIn(t, `1 2 0:1 / /a\040b rw - tmpfs t\134x rw`+"\n", "/a b"); m.Source != `t\x` {
		t.Fatalf("%+v", m)
	}
}

func TestMountAtSelf(t *testing.T) {
	if m, ok, err := mountAt("/"); err != nil || !ok || m.Mountpoint != "/" {
		t.Fatalf("/: %+v %v %v", m, ok, err)
	}
	dir := t.TempDir()
	if m, ok, err := mountAt(dir); err != nil || ok {
		t.Fatalf("%s is no mount point, got %+v %v", dir, m, err)
	}
}

func TestOverlayOptsNewMountAPI(t *testing.T) {
	l, err := parseOverlayOpts(`rw,lowerdir+=/l/A,lowerdir+=/l/B,datadir+=/d,upperdir=/u,workdir=/w`)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Lower, []string{"/l/A", "/l/B"}) || l.Upper != "/u" {
		t.Fatalf("%+v", l)
	}
}

func TestOverlayOptsEscapedComma(t *testing.T) {
	l, err := parseOverlayOpts(`lowerdir=/l/a\,b,upperdir=/u,workdir=/w`)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Lower, []string{"/l/a,b"}) {
		t.Fatalf("%+v", l)
	}
}

func TestReadOnlyOverlayRefused(t *testing.T) {
	if _, err := parseOverlayOpts(`lowerdir=/l/a:/l/b`); err == nil {
		t.Fatal("an overlay with no upper layer has nothing to capture and must be refused")
	}
}

func TestOverlayDataOnlyLayersAreNotTree(t *testing.T) {
	l, err := parseOverlayOpts(`lowerdir=/l/A:/l/B::/d/1:/d/2,upperdir=/u,workdir=/w`)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Lower, []string{"/l/A", "/l/B"}) {
		t.Fatalf("%+v", l)
	}
}

// A layer named by its short link is the layer its path names.
func TestSameLayersResolvesLinks(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"aaa/diff", "bbb/diff", "l"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Symlink("../aaa/diff", filepath.Join(root, "l", "SHORTA"))
	os.Symlink("../bbb/diff", filepath.Join(root, "l", "SHORTB"))
	mounted := []string{filepath.Join(root, "l", "SHORTA"), filepath.Join(root, "l", "SHORTB")}
	if !sameLayers(mounted, []string{filepath.Join(root, "aaa/diff"), filepath.Join(root, "bbb/diff")}) {
		t.Error("short links and paths of the same layers differ")
	}
	if sameLayers(mounted, []string{filepath.Join(root, "bbb/diff"), filepath.Join(root, "aaa/diff")}) {
		t.Error("layers in another order are the same")
	}
	if sameLayers(mounted, []string{filepath.Join(root, "aaa/diff")}) {
		t.Error("fewer layers are the same")
	}
}
