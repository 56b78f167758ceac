package fork

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// Recovery thaws a source only when its capture's journal says it may have
// left it frozen: a container the user paused later stays paused.
func TestRecoveryThawsOnlyWhatItFroze(t *testing.T) {
	for _, c := range []struct {
		phase journal.Phase
		want  string
	}{
		{journal.CaptureFrozen, "THAWED"},
		{journal.CaptureDumped, "FROZEN"},
	} {
		e := testEngine(t)
		freezer := t.TempDir()
		state := filepath.Join(freezer, "freezer.state")
		os.WriteFile(state, []byte("FROZEN"), 0o644)
		entry, err := e.journal().Begin(journal.Record{Kind: journal.Capture, Phase: c.phase, Capture: &journal.CaptureRecord{FreezerDir: freezer, SourceID: "src"}})
		if err != nil {
			t.Fatal(err)
		}
		entry.Rec.Owner = journal.Owner{Pid: os.Getpid(), StartTime: journal.Self().StartTime + 1} // died
		entry.Save()
		r, err := e.Recover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(state); string(got) != c.want {
			t.Errorf("phase %s: freezer %s, want %s", c.phase, got, c.want)
		}
		if r.Captures != 1 {
			t.Errorf("phase %s: %d captures recovered", c.phase, r.Captures)
		}
	}
}

// testEngine is an engine on scratch directories, with no crun: recovery
// that reaches for crun fails the test.
func testEngine(t *testing.T) *Engine {
	return &Engine{Store: plan.Store{Layout: plan.LayoutUnder(t.TempDir())}}
}

// orphan writes a journal entry whose owner has died.
func orphan(t *testing.T, e *Engine, rec journal.Record) {
	t.Helper()
	entry, err := e.journal().Begin(rec)
	if err != nil {
		t.Fatal(err)
	}
	entry.Rec.Owner = journal.Owner{Pid: os.Getpid(), StartTime: journal.Self().StartTime + 1}
	if err := entry.Save(); err != nil {
		t.Fatal(err)
	}
}

func journalEntries(t *testing.T, e *Engine) int {
	entries, err := os.ReadDir(e.Store.JournalDir())
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// A capture's entry stays until its source is known to run: a thaw that
// fails keeps it for the next recovery, which finishes it.
func TestRecoveryKeepsEntryUntilSourceThawed(t *testing.T) {
	e := testEngine(t)
	freezer := t.TempDir()
	state := filepath.Join(freezer, "freezer.state")
	// A directory where the state file should be: reading it fails.
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	orphan(t, e, journal.Record{Kind: journal.Capture, Phase: journal.CaptureFrozen, Capture: &journal.CaptureRecord{FreezerDir: freezer, SourceID: "src"}})
	if _, err := e.Recover(context.Background()); err == nil || !strings.Contains(err.Error(), "tclone gc") {
		t.Fatalf("a failed thaw was not reported with what to do: %v", err)
	}
	if n := journalEntries(t, e); n != 1 {
		t.Fatalf("%d journal entries after a failed thaw, want the capture's to stay", n)
	}
	os.Remove(state)
	os.WriteFile(state, []byte("FROZEN"), 0o644)
	r, err := e.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(state); string(got) != "THAWED" || len(r.Thawed) != 1 {
		t.Fatalf("second recovery: freezer %s, thawed %v", got, r.Thawed)
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries after the source was thawed", n)
	}
}

// A capture whose tclone died while its CRIU still held the source: recovery
// ends that CRIU (the kernel then lets the tree go), and only then drops the
// entry.
func TestRecoveryEndsTheCaptureCRIU(t *testing.T) {
	e := testEngine(t)
	criu := exec.Command("sleep", "600")
	if err := criu.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { criu.Wait(); close(exited) }()
	defer criu.Process.Kill()
	owner, ok := journal.OwnerOf(criu.Process.Pid)
	if !ok {
		t.Fatal("no owner for a running process")
	}
	orphan(t, e, journal.Record{Kind: journal.Capture, Phase: journal.CaptureSeized, Capture: &journal.CaptureRecord{SourceID: "src", Criu: &owner}})
	if _, err := e.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the capture's CRIU still runs after recovery")
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries left", n)
	}
}

// While another capture of the same source runs (it may hold a network lock
// of its own), recovery leaves a dead capture's network alone and keeps its
// entry for later.
func TestRecoveryWaitsForLiveCaptureOfSource(t *testing.T) {
	e := testEngine(t)
	orphan(t, e, journal.Record{Kind: journal.Capture, Phase: journal.CaptureSeized, Capture: &journal.CaptureRecord{SourceID: "src", Source: &journal.SourceRefs{NetNS: "/nonexistent", NetworkLocked: true}}})
	unlock, err := e.lockSource(context.Background(), "src")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Recover(context.Background()); err == nil {
		t.Fatal("recovery reported success while another capture held the source")
	}
	if n := journalEntries(t, e); n != 1 {
		t.Fatalf("%d journal entries, want the dead capture's kept", n)
	}
	unlock()
	if _, err := e.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries left", n)
	}
}

// A sibling an older tclone recorded as committed is never undone, even
// when its entry outlived that tclone: it was reported created.
func TestRecoveryKeepsCommittedSibling(t *testing.T) {
	e := testEngine(t)
	root := t.TempDir()
	marker := filepath.Join(root, "file")
	os.WriteFile(marker, []byte("sibling data"), 0o644)
	orphan(t, e, journal.Record{Kind: journal.Materialize, Phase: journal.PhaseCommitted, Materialize: &journal.MaterializeRecord{SiblingID: "sib", SiblingCreated: true, RootTarget: root, RootFilled: true}})
	if _, err := e.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("recovery emptied a committed sibling's root: %v", err)
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries left", n)
	}
}

// A materialisation whose tclone and watchdog both died leaves its crun
// restore running, or stopped where the watchdog stopped it: recovery
// kills it and what it started, which frees the caller's stdio.
func TestRecoveryKillsOrphanRestore(t *testing.T) {
	e := testEngine(t)
	// A stand-in for crun with CRIU below it, stopped.
	cmd := exec.Command("sh", "-c", "sleep 300 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	deadline := time.Now().Add(5 * time.Second)
	for len(descendants(cmd.Process.Pid)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	child := descendants(cmd.Process.Pid)
	if len(child) != 1 {
		t.Fatalf("stand-in children %v", child)
	}
	syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP)
	crunProc, ok := journal.OwnerOf(cmd.Process.Pid)
	if !ok {
		t.Fatal("stand-in gone")
	}
	orphan(t, e, journal.Record{Kind: journal.Materialize, Phase: journal.MaterializeRestore,
		Materialize: &journal.MaterializeRecord{SiblingID: "sib", Restorer: &crunProc}})
	if _, err := e.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the orphan restore still runs after recovery")
	}
	// Killed: gone, or reparented and not yet reaped, within moments (a
	// SIGKILLed process still takes a little while to exit).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child[0]))
		if err != nil || strings.Contains(string(st), ") Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restore's child %d survived recovery", child[0])
		}
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries left", n)
	}
}

// A CRIU still working in a plan that is gone is killed: removed by hand,
// by the store (renamed out of its namespace, then emptied), or renamed by
// a removal that was cut short. One working in a live plan, and any other
// program, is not. A stopped one (a CRIU probe's child whose CRIU was
// killed) is killed as well.
func TestKillOrphanCRIUs(t *testing.T) {
	e := testEngine(t)
	bin := filepath.Join(t.TempDir(), "criu")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(sleep)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(exe, id string) *exec.Cmd {
		work := filepath.Join(e.Store.Dir(id), "work")
		if err := os.MkdirAll(work, 0o700); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "60")
		cmd.Dir = work
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	gone, removed, cut, live := plan.NewID(), plan.NewID(), plan.NewID(), plan.NewID()
	orphans := []*exec.Cmd{start(bin, gone), start(bin, removed), start(bin, cut)}
	if err := orphans[2].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	kept := start(bin, live)
	other := start(sleep, gone)
	os.RemoveAll(e.Store.Dir(gone))
	if err := e.Store.Remove(e.Store.Dir(removed)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.Store.Dir(cut), filepath.Join(e.Store.PlansDir(), ".removing-"+cut+"-"+plan.NewID())); err != nil {
		t.Fatal(err)
	}
	if n := e.killOrphanCRIUs(); n != len(orphans) {
		t.Fatalf("killed %d, want %d", n, len(orphans))
	}
	for _, orphan := range orphans {
		if err := orphan.Wait(); err == nil {
			t.Fatalf("the orphan CRIU in %s was not killed", orphan.Dir)
		}
	}
	for _, c := range []*exec.Cmd{kept, other} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("%s in %s was killed", c.Path, c.Dir)
		}
	}
}
