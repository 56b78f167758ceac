package hostagent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file of the parent's layer that the branch lacks is hidden by one that
// reads as empty: a CRIU image keeps its magics and loses its entries.
func TestStandIns(t *testing.T) {
	layer, parentImages := t.TempDir(), t.TempDir()
	core := append([]byte{0x19, 0x43, 0x56, 0x54, 0x01, 0x02, 0x03, 0x04}, []byte("entries")...)
	os.WriteFile(filepath.Join(parentImages, "core-9.img"), core, 0o600)
	os.WriteFile(filepath.Join(parentImages, "tmpfs-dev-5.tar.gz.img"), []byte("\x1f\x8b raw"), 0o600)
	for rel, want := range map[string][]byte{
		"checkpoint/core-9.img":              core[:8],
		"checkpoint/tmpfs-dev-5.tar.gz.img":  {},
		"volumes/cache.tar":                  make([]byte, 1024),
		deletedFiles:                         []byte("[]"),
		"tclone/branch/files/gone":           {},
		devShmTar:                            make([]byte, 1024),
		"checkpoint/no-longer-in-parent.img": {},
	} {
		if err := writeStandIn(layer, rel, parentImages); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(layer, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("stand-in for %s: %q, %v; want %q", rel, got, err, want)
		}
	}
}

func TestIsPagesImage(t *testing.T) {
	for rel, want := range map[string]bool{
		"checkpoint/pages-1.img": true, "checkpoint/pages-536870913.img": true,
		"checkpoint/pagemap-1.img": false, "checkpoint/parent/pages-1.img": false, "tclone/plan/images/pages-1.img": false,
	} {
		if got := isPagesImage(rel); got != want {
			t.Errorf("isPagesImage(%q) = %v", rel, got)
		}
	}
}

// The union of a delta image's two layers; a link is let through only as a
// delta's link to its parent's pages image.
func TestMergeLayerAndItsLinks(t *testing.T) {
	lower, top := t.TempDir(), filepath.Join(t.TempDir(), "top")
	os.MkdirAll(filepath.Join(lower, "checkpoint"), 0o700)
	os.WriteFile(filepath.Join(lower, "checkpoint", "pages-1.img"), []byte("parent pages"), 0o600)
	os.WriteFile(filepath.Join(lower, "checkpoint", "core-1.img"), []byte("old core"), 0o600)
	os.MkdirAll(filepath.Join(top, "checkpoint", "parent"), 0o700)
	os.WriteFile(filepath.Join(top, "checkpoint", "core-1.img"), []byte("new core"), 0o600)
	os.Symlink("../pages-1.img", filepath.Join(top, "checkpoint", "parent", "pages-1.img"))
	if err := checkLayerFiles("img", top); err != nil {
		t.Fatal(err)
	}
	if err := mergeLayer(top, lower); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(lower, "checkpoint", "core-1.img")); string(got) != "new core" {
		t.Errorf("the top layer's file: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(lower, "checkpoint", "parent", "pages-1.img")); string(got) != "parent pages" {
		t.Errorf("through the parent link: %q", got)
	}
	if _, err := os.Stat(top); !os.IsNotExist(err) {
		t.Errorf("the top layer's directory is left: %v", err)
	}
	for name, target := range map[string]string{"parent/pages-2.img": "/etc/shadow", "core-2.img": "../pages-1.img", "parent/core-1.img": "../core-1.img"} {
		bad := t.TempDir()
		os.MkdirAll(filepath.Join(bad, "checkpoint", "parent"), 0o700)
		os.Symlink(target, filepath.Join(bad, "checkpoint", name))
		if err := checkLayerFiles("img", bad); err == nil || !strings.Contains(err.Error(), "neither a directory nor a regular file") {
			t.Errorf("a link %s -> %s: %v", name, target, err)
		}
	}
	clash := t.TempDir()
	os.MkdirAll(filepath.Join(clash, "checkpoint", "core-1.img"), 0o700)
	if err := mergeLayer(clash, lower); err == nil || !strings.Contains(err.Error(), "a directory in its top layer and a file below") {
		t.Errorf("a directory over a file: %v", err)
	}
}
