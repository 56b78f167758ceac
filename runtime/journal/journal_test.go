package journal

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestOrphansAreEntriesOfDeadOwners(t *testing.T) {
	j := Journal{Dir: t.TempDir()}
	live, err := j.Begin(Record{Kind: Capture, PlanDir: "/p/live"})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := j.Begin(Record{Kind: Materialize, SiblingID: "s"})
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
	if len(orphans) != 1 || orphans[0].Rec.SiblingID != "s" {
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
	dead := filepath.Join(j.Dir, strings.Split(filepath.Base(first[0].path), claimSep)[0]+claimSep+formatOwner(Owner{Pid: os.Getpid(), StartTime: 1}))
	if err := os.Rename(first[0].path, dead); err != nil {
		t.Fatal(err)
	}
	again, _ := j.Orphans()
	if len(again) != 1 || again[0].Rec.PlanDir != "/p" {
		t.Fatalf("a dead claimer's orphan was not reclaimed: %+v", again)
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
	e, _ := j.Begin(Record{Kind: Materialize, Phase: "restore", SiblingCreated: true})
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
	again, _ := j.Orphans()
	if len(again) != 1 || again[0].Rec.PlanDir != "/p" {
		t.Fatalf("an unclaimed orphan was not claimed again: %+v", again)
	}
	again[0].End()
	if entries, _ := os.ReadDir(j.Dir); len(entries) != 0 {
		t.Fatalf("left: %v", entries)
	}
}
