package journal

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestOrphansAreEntriesOfDeadOwners(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	live, err := j.Begin(Record{Kind: Capture, PlanDir: "/p/live"})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := j.Begin(Record{Kind: Materialize, Materialize: &MaterializeRecord{SiblingID: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	// Give the second entry the identity of a process that has exited.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead.Rec.Owner = Owner{Pid: cmd.Process.Pid, StartTime: 1}
	if err := dead.Save(); err != nil {
		t.Fatal(err)
	}
	orphans, err := j.Orphans()
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || orphans[0].Rec.Materialize.SiblingID != "s" {
		t.Fatalf("orphans %+v", orphans)
	}
	if err := orphans[0].End(); err != nil {
		t.Fatal(err)
	}
	live.End()
	if entries, _ := os.ReadDir(j.Dir); len(entries) != 0 {
		t.Fatalf("entries left: %v", entries)
	}
}

func TestSelfIsAlive(t *testing.T) {
	if !Self().Alive() {
		t.Fatal("the calling process is not alive")
	}
	if (Owner{Pid: os.Getpid(), StartTime: Self().StartTime + 1}).Alive() {
		t.Fatal("a reused PID counted as the same process")
	}
}

// An orphan is claimed by one recovery only, and the claim of a recovery
// that died is claimed again.
func TestOrphanClaimedOnce(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	e, err := j.Begin(Record{Kind: Capture, PlanDir: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	e.Rec.Owner = Owner{Pid: os.Getpid(), StartTime: Self().StartTime + 1}
	e.Save()
	first, _ := j.Orphans()
	second, _ := j.Orphans()
	if len(first) != 1 || len(second) != 0 {
		t.Fatalf("claimed %d then %d times", len(first), len(second))
	}
	// The claimer (this process, under a false identity) dies.
	dead := ClaimedBy(Unclaimed(first[0].path), Owner{Pid: os.Getpid(), StartTime: 1})
	if err := os.Rename(first[0].path, dead); err != nil {
		t.Fatal(err)
	}
	requireReclaimed(t, j, "a dead claimer's orphan")
}

// requireReclaimed claims the one orphan left in j, of a capture of plan
// "/p", and ends it.
func requireReclaimed(t *testing.T, j Journal, what string) {
	t.Helper()
	again, _ := j.Orphans()
	if len(again) != 1 || again[0].Rec.PlanDir != "/p" {
		t.Fatalf("%s was not claimed again: %+v", what, again)
	}
	again[0].End()
	if entries, _ := os.ReadDir(j.Dir); len(entries) != 0 {
		t.Fatalf("left: %v", entries)
	}
}

// An entry an older version marked committed is still an orphan once its
// owner dies, and says committed.
func TestCommittedEntrySurvivesAsCommitted(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	e, _ := j.Begin(Record{Kind: Materialize, Phase: "restore", Materialize: &MaterializeRecord{SiblingCreated: true}})
	if err := e.Update(func(r *Record) { r.Phase = PhaseCommitted }); err != nil {
		t.Fatal(err)
	}
	e.Rec.Owner = Owner{Pid: os.Getpid(), StartTime: Self().StartTime + 1}
	e.Save()
	o, _ := j.Orphans()
	if len(o) != 1 || o[0].Rec.Phase != PhaseCommitted {
		t.Fatalf("orphans %+v", o)
	}
	o[0].End()
}

// An orphan given back is claimed again by the next recovery.
func TestUnclaim(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	e, _ := j.Begin(Record{Kind: Capture, PlanDir: "/p"})
	e.Rec.Owner = Owner{Pid: os.Getpid(), StartTime: Self().StartTime + 1}
	e.Save()
	first, _ := j.Orphans()
	if len(first) != 1 {
		t.Fatalf("claimed %d", len(first))
	}
	if none, _ := j.Orphans(); len(none) != 0 {
		t.Fatal("a claimed orphan was claimed twice")
	}
	if err := first[0].Unclaim(); err != nil {
		t.Fatal(err)
	}
	requireReclaimed(t, j, "an unclaimed orphan")
}

// Entries written by older versions were flat: their fields are read into
// the record of their kind, so that a recovery after an upgrade still
// undoes what they made.
func TestLegacyFlatRecord(t *testing.T) {
	var c Record
	if err := json.Unmarshal([]byte(`{"kind":"capture","phase":"seized","plan_dir":"/p","source_id":"src","criu":{"pid":7,"start_time":9},"source":{"net_ns":"/n"}}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.Phase != CaptureSeized || c.PlanDir != "/p" || c.Capture == nil || c.Capture.SourceID != "src" ||
		c.Capture.Criu == nil || c.Capture.Criu.Pid != 7 || c.Capture.Source == nil || c.Capture.Source.NetNS != "/n" || c.Materialize != nil {
		t.Fatalf("legacy capture read as %+v", c)
	}
	var m Record
	if err := json.Unmarshal([]byte(`{"kind":"materialize","phase":"restore","sibling_id":"sib","sibling_created":true,"root_target":"/r","owns_plan":true}`), &m); err != nil {
		t.Fatal(err)
	}
	if m.Materialize == nil || m.Materialize.SiblingID != "sib" || !m.Materialize.SiblingCreated || m.Materialize.RootTarget != "/r" || !m.Materialize.OwnsPlan || m.Capture != nil {
		t.Fatalf("legacy materialisation read as %+v", m)
	}
	// A record of this version keeps its own.
	data, _ := json.Marshal(Record{Kind: Materialize, Phase: MaterializeRootfs, Materialize: &MaterializeRecord{SiblingID: "s", RootFilled: true}})
	var n Record
	if err := json.Unmarshal(data, &n); err != nil || n.Materialize == nil || n.Materialize.SiblingID != "s" || !n.Materialize.RootFilled {
		t.Fatalf("round trip of %s: %+v %v", data, n, err)
	}
	if strings.Contains(string(data), `"sibling_id":"s","kind"`) {
		t.Fatalf("record not nested: %s", data)
	}
}

// An update's temporary file, left by a writer killed before its rename, is
// removed once it is clearly stale; a fresh one may be a write in progress.
func TestOrphansRemovesStaleUpdateTemps(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(j.Dir, "capture-1-2.json.tmp123")
	fresh := filepath.Join(j.Dir, "capture-1-3.json.tmp456")
	// Its owner's process is gone: no update of it is in progress.
	ownerGone := filepath.Join(j.Dir, fmt.Sprintf("capture-%d-4.json.tmp789", dead.Process.Pid))
	for _, p := range []string{stale, fresh, ownerGone} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Minute)
	os.Chtimes(stale, old, old)
	if _, err := j.Orphans(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("a stale update temp was kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh update temp was removed: %v", err)
	}
	if _, err := os.Stat(ownerGone); err == nil {
		t.Error("the update temp of an entry whose owner is gone was kept")
	}
}
