package criuhooks

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/utsns"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
)

// A sibling's image directory links every plan image but the UTS one,
// which is its own copy naming the sibling's hostname; the plan's images
// are left as they were.
func TestSiblingImages(t *testing.T) {
	plan, dir := t.TempDir(), filepath.Join(t.TempDir(), "sib")
	imagetest.Write(t, filepath.Join(plan, "utsns-12.img"), "UTSNS",
		&utsns.UtsnsEntry{Nodename: proto.String("source"), Domainname: proto.String("(none)")})
	if err := os.WriteFile(filepath.Join(plan, "pages-1.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SiblingImages(plan, dir, "sibling"); err != nil {
		t.Fatal(err)
	}
	got := readImage(t, filepath.Join(dir, "utsns-12.img"), &utsns.UtsnsEntry{})
	if len(got) != 1 || got[0].(*utsns.UtsnsEntry).GetNodename() != "sibling" || got[0].(*utsns.UtsnsEntry).GetDomainname() != "(none)" {
		t.Fatalf("sibling's UTS image: %v", got)
	}
	if src := readImage(t, filepath.Join(plan, "utsns-12.img"), &utsns.UtsnsEntry{}); src[0].(*utsns.UtsnsEntry).GetNodename() != "source" {
		t.Fatalf("the plan's UTS image changed: %v", src)
	}
	a, _ := os.Stat(filepath.Join(plan, "pages-1.img"))
	b, err := os.Stat(filepath.Join(dir, "pages-1.img"))
	if err != nil || a.Sys().(*syscall.Stat_t).Ino != b.Sys().(*syscall.Stat_t).Ino {
		t.Fatalf("pages are not a hard link of the plan's: %v", err)
	}
	// Without a hostname to give, the UTS image is linked too.
	dir2 := filepath.Join(t.TempDir(), "sib2")
	if err := SiblingImages(plan, dir2, ""); err != nil {
		t.Fatal(err)
	}
	if got := readImage(t, filepath.Join(dir2, "utsns-12.img"), &utsns.UtsnsEntry{}); got[0].(*utsns.UtsnsEntry).GetNodename() != "source" {
		t.Fatalf("kept hostname: %v", got)
	}
}

// A drain's temporary files, which come and go under the daemon, are never
// linked (one that went between the listing and its link failed a restore).
func TestSiblingImagesSkipsDrainTemporaries(t *testing.T) {
	plan, dir := t.TempDir(), filepath.Join(t.TempDir(), "sib")
	for _, name := range []string{"pagemap-7.img", "pagemap-7.img.drained", "pages-1073741831.img.tmp"} {
		if err := os.WriteFile(filepath.Join(plan, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := SiblingImages(plan, dir, ""); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "pagemap-7.img" {
		t.Fatalf("sibling images %v, want pagemap-7.img alone", entries)
	}
}
