package criuhooks

import (
	"os"
	"path/filepath"
	"strconv"
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

// A drain that puts a new pagemap in place of the one a sibling is linking
// (by rename, which takes the old file's last name) does not fail the
// sibling: link() then refuses with ENOENT although the name is there.
func TestSiblingImagesWhileDrainRenames(t *testing.T) {
	plan := t.TempDir()
	pagemap := filepath.Join(plan, "pagemap-7.img")
	if err := os.WriteFile(pagemap, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	stop, renamed := make(chan struct{}), make(chan error, 1)
	go func() {
		tmp := pagemap + ".drained"
		for n := 0; ; n++ {
			select {
			case <-stop:
				renamed <- nil
				return
			default:
			}
			if err := os.WriteFile(tmp, []byte{byte(n)}, 0o600); err != nil {
				renamed <- err
				return
			}
			if err := os.Rename(tmp, pagemap); err != nil {
				renamed <- err
				return
			}
		}
	}()
	sibs := t.TempDir()
	var failed error
	for i := 0; i < 3000 && failed == nil; i++ {
		dir := filepath.Join(sibs, strconv.Itoa(i))
		if failed = SiblingImages(plan, dir, ""); failed == nil {
			if _, err := os.Stat(filepath.Join(dir, "pagemap-7.img")); err != nil {
				failed = err
			}
		}
		os.RemoveAll(dir)
	}
	close(stop)
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
	if failed != nil {
		t.Fatalf("sibling images while the drain renames: %v", failed)
	}
}
