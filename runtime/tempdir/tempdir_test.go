package tempdir

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
)

func TestCollectOnlyAbandoned(t *testing.T) {
	root := t.TempDir()
	t.Setenv("TMPDIR", root)
	live, err := Make(ForkPrefix)
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := Make(ServicePrefix)
	gone := journal.Self()
	gone.StartTime++
	write(dead, owners{Version: 1, Owners: []journal.Owner{gone}})
	// A dead owner with a live co-owner keeps the directory.
	shared, _ := Make(ServicePrefix)
	write(shared, owners{Version: 1, Owners: []journal.Owner{gone, journal.Self()}})
	legacyOld := filepath.Join(root, ForkPrefix+"old")
	legacyNew := filepath.Join(root, ForkPrefix+"new")
	other := filepath.Join(root, "someone-else")
	for _, d := range []string{legacyOld, legacyNew, other} {
		os.Mkdir(d, 0o700)
	}
	old := time.Now().Add(-2 * LegacyAge)
	os.Chtimes(legacyOld, old, old)
	os.Chtimes(other, old, old)

	removed, err := Collect([]string{root, root}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{dead: true, legacyOld: true}
	if len(removed) != len(want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, d := range removed {
		if !want[d] {
			t.Errorf("removed %s", d)
		}
	}
	for _, d := range []string{live, shared, legacyNew, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}

func TestAddOwner(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir, err := Make(ServicePrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := AddOwner(dir, os.Getppid()); err != nil {
		t.Fatal(err)
	}
	o, err := read(dir)
	if err != nil || len(o.Owners) != 2 || o.Owners[1].Pid != os.Getppid() {
		t.Fatalf("%+v %v", o, err)
	}
}
