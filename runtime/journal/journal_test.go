package journal

import (
	"os"
	"os/exec"
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
