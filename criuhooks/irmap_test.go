package criuhooks

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fh"
)

// The cache is an image CRIU (here: crit, its decoder) reads back entry by
// entry.
func TestWriteIrmapCache(t *testing.T) {
	dir := t.TempDir()
	want := []IrmapEntry{{Dev: 0x3b, Inode: 0x984381, Path: "/srv/app/f"}, {Dev: 0x3b, Inode: 7, Path: "/srv/app"}}
	if err := WriteIrmapCache(dir, want); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, IrmapCacheFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(&fh.IrmapCacheEntry{})
	if err != nil {
		t.Fatal(err)
	}
	if img.Magic != "IRMAP_CACHE" || len(img.Entries) != len(want) {
		t.Fatalf("decoded %s with %d entries", img.Magic, len(img.Entries))
	}
	for i, e := range img.Entries {
		got := e.Message.(*fh.IrmapCacheEntry)
		if got.GetDev() != want[i].Dev || got.GetInode() != want[i].Inode || got.GetPath() != want[i].Path {
			t.Errorf("entry %d: %v, want %+v", i, got, want[i])
		}
	}
}
