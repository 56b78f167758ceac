package fork

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

func bindSpec(mounts map[string]string) *specs.Spec {
	s := &specs.Spec{}
	for dest, src := range mounts {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dest, Source: src, Type: "bind", Options: []string{"rbind"}})
	}
	return s
}

// A volume copied at the capture goes into the sibling's own empty
// directory mounted at the same place, and undoing the sibling empties it
// again. A sibling that mounts the source's own directory there, or one
// holding files, or nothing at all, is refused before anything is written;
// a private /dev/shm the sibling shares with the source is left alone.
func TestVolumesIntoSibling(t *testing.T) {
	dir := t.TempDir()
	srcVol := filepath.Join(dir, "src-data")
	os.MkdirAll(filepath.Join(srcVol, "sub"), 0o755)
	os.WriteFile(filepath.Join(srcVol, "sub", "f"), []byte("at the fork"), 0o644)
	src := &source{id: "src", spec: bindSpec(map[string]string{"/data": srcVol})}
	vols, err := captureVolumes(src, []forkopts.Volume{{Name: "data", Source: srcVol, Destination: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	copies, err := copyVolumes(context.Background(), vols, filepath.Join(dir, "plan.volumes"))
	if err != nil || len(copies) != 1 || copies[0].Stats.Files != 1 {
		t.Fatalf("copies %+v %v", copies, err)
	}
	// The source writes on after the capture: the sibling gets the copy.
	os.WriteFile(filepath.Join(srcVol, "sub", "f"), []byte("later"), 0o644)
	p := &plan.Plan{Volumes: append(copies, plan.Volume{Volume: forkopts.Volume{Name: shmVolume, Source: "/shared/shm", Destination: shmVolume}})}

	sibVol := filepath.Join(dir, "sib-data")
	os.Mkdir(sibVol, 0o755)
	for what, spec := range map[string]*specs.Spec{
		"the source's own": bindSpec(map[string]string{"/data": srcVol}),
		"no directory":     bindSpec(nil),
	} {
		if _, err := siblingVolumes(p, spec, dir); err == nil {
			t.Errorf("a sibling mounting %s at /data was accepted", what)
		}
	}
	full := filepath.Join(dir, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "precious"), []byte("x"), 0o644)
	if _, err := siblingVolumes(p, bindSpec(map[string]string{"/data": full}), dir); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a sibling volume holding files: %v", err)
	}

	// A /dev/shm outside the sibling's bundle (the host's, say) is shared,
	// never filled; one in its bundle is its own.
	hostShm, ownShm := filepath.Join(dir, "host-shm"), filepath.Join(dir, "bundle", "shm")
	os.MkdirAll(hostShm, 0o755)
	os.MkdirAll(ownShm, 0o755)
	if got, err := siblingVolumes(p, bindSpec(map[string]string{"/data": sibVol, shmVolume: hostShm}), filepath.Join(dir, "bundle")); err != nil || len(got) != 1 {
		t.Fatalf("a /dev/shm outside the sibling's bundle: %+v %v", got, err)
	}
	if got, err := siblingVolumes(p, bindSpec(map[string]string{"/data": sibVol, shmVolume: ownShm}), filepath.Join(dir, "bundle")); err != nil || len(got) != 2 {
		t.Fatalf("the sibling's own /dev/shm: %+v %v", got, err)
	}
	targets, err := siblingVolumes(p, bindSpec(map[string]string{"/data": sibVol, shmVolume: "/shared/shm"}), dir)
	if err != nil || len(targets) != 1 || targets[0].target != sibVol {
		t.Fatalf("targets %+v %v", targets, err)
	}
	e := testEngine(t)
	entry, err := e.journal().Begin(journal.Record{Kind: journal.Materialize, Materialize: &journal.MaterializeRecord{}})
	if err != nil {
		t.Fatal(err)
	}
	defer entry.End()
	if _, err := fillVolumes(entry, targets); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sibVol, "sub", "f")); string(b) != "at the fork" {
		t.Fatalf("the sibling's volume holds %q", b)
	}
	if err := e.undoMaterialize(context.Background(), entry.Rec); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(sibVol); len(left) != 0 {
		t.Errorf("undo left %v in the sibling's volume", left)
	}
	if _, err := os.Stat(filepath.Join(full, "precious")); err != nil {
		t.Error("undo touched a directory it did not fill")
	}
}

// Only the volumes the source mounts where the request says are copied,
// and only directories.
func TestCaptureVolumesChecksTheSource(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	src := &source{id: "src", spec: bindSpec(map[string]string{"/data": dir, "/f": file})}
	for _, v := range []forkopts.Volume{
		{Name: "elsewhere", Source: dir, Destination: "/other"},
		{Name: "other-dir", Source: "/tmp", Destination: "/data"},
		{Name: "file", Source: file, Destination: "/f"},
	} {
		if _, err := captureVolumes(src, []forkopts.Volume{v}); err == nil {
			t.Errorf("volume %+v accepted", v)
		}
	}
}

// Volume copies whose plan is gone (a capture killed after copying them,
// say) are removed by recovery's sweep; a live plan's are kept.
func TestStrayVolumeCopiesRemoved(t *testing.T) {
	e := testEngine(t)
	gone, live := plan.NewID(), plan.NewID()
	for _, id := range []string{gone, live} {
		if err := os.MkdirAll(filepath.Join(e.Store.VolumesDir(id), "0"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(e.Store.Dir(live), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := e.removeStraySnapshots(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.Store.VolumesDir(gone)); !os.IsNotExist(err) {
		t.Error("the volume copies of a plan that is gone were kept")
	}
	if _, err := os.Stat(e.Store.VolumesDir(live)); err != nil {
		t.Error("a live plan's volume copies were removed")
	}
}

// A snapshot store inside the volume (one filesystem mounted at both, so
// that the names differ) is refused instead of copying the copy into
// itself without end.
func TestVolumeCopyRefusesItsOwnInside(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	os.MkdirAll(vol, 0o755)
	os.WriteFile(filepath.Join(vol, "f"), []byte("x"), 0o644)
	link := filepath.Join(dir, "store")
	if err := os.Symlink(vol, link); err != nil {
		t.Fatal(err)
	}
	vols := []volumeToCopy{{Volume: forkopts.Volume{Name: "data", Source: vol, Destination: "/data"}, from: vol}}
	_, err := copyVolumes(context.Background(), vols, filepath.Join(link, "plan.volumes"))
	if err == nil || !strings.Contains(err.Error(), "inside the volume itself") {
		t.Fatalf("a copy into the volume itself: %v", err)
	}
	if _, err := copyVolumes(context.Background(), vols, filepath.Join(dir, "plan.volumes")); err != nil {
		t.Fatalf("a copy beside the volume: %v", err)
	}
}
