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
