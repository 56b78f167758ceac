package rootfs

import (
	"reflect"
	"testing"
)

func TestParseMountinfoLine(t *testing.T) {
	line := `48 43 0:41 / /var/lib/containers/storage/overlay/8a85/merged rw,nodev,relatime - overlay overlay rw,lowerdir=/l/A:/l/B,upperdir=/o/8a85/diff,workdir=/o/8a85/work,uuid=on`
	m, ok := parseMountinfoLine(line)
	if !ok {
		t.Fatal("not parsed")
	}
	if m.MountPoint != "/var/lib/containers/storage/overlay/8a85/merged" || m.FSType != "overlay" {
		t.Fatalf("%+v", m)
	}
	l, err := parseOverlayOpts(m.SuperOpts)
	if err != nil {
		t.Fatal(err)
	}
	want := overlayLayers{Lower: []string{"/l/A", "/l/B"}, Upper: "/o/8a85/diff"}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("got %+v want %+v", l, want)
	}
}

func TestMountinfoEscapes(t *testing.T) {
	m, ok := parseMountinfoLine(`1 2 0:1 / /a\040b rw - tmpfs t\134x rw`)
	if !ok || m.MountPoint != "/a b" || m.Source != `t\x` {
		t.Fatalf("%+v", m)
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
