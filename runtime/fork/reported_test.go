package fork

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// A sibling whose journal entry cannot be ended after its restore is not
// reported: reported fails, and the entry stays for the watchdog (or the
// next recovery) to undo the sibling, which nobody was told about.
func TestSiblingNotReportedWhenItsEntryCannotEnd(t *testing.T) {
	e := testEngine(t)
	dir := filepath.Join(e.Store.PlansDir(), "p1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{Version: plan.FormatVersion, ID: "p1", ExpiresAt: time.Now().Add(time.Hour)}
	if err := p.Write(dir); err != nil {
		t.Fatal(err)
	}
	if err := plan.SetUses(dir, 2, nil); err != nil {
		t.Fatal(err)
	}
	lease, err := e.Store.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := e.journal().Begin(journal.Record{Kind: journal.Materialize, Phase: journal.MaterializePrepare, PlanDir: dir,
		Materialize: &journal.MaterializeRecord{SiblingID: "s1"}})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(e.Store.JournalDir())
	if len(files) != 1 {
		t.Fatalf("journal holds %d entries, want 1", len(files))
	}
	// An entry file that cannot be removed: a directory with something in it.
	path := filepath.Join(e.Store.JournalDir(), files[0].Name())
	os.Remove(path)
	if err := os.MkdirAll(filepath.Join(path, "busy"), 0o700); err != nil {
		t.Fatal(err)
	}
	op := &materializeOp{e: e, req: MaterializeRequest{ID: "s1"}, lease: lease, entry: entry}
	err = op.reported()
	if err == nil || !strings.Contains(err.Error(), "ending its journal entry failed") {
		t.Fatalf("reported() = %v, want the journal entry's failure", err)
	}
	if _, serr := os.Stat(filepath.Join(path, "busy")); serr != nil {
		t.Fatalf("the entry went: %v", serr)
	}
	if m := (&Materialized{reported: op.reported}); m.Reported() == nil {
		t.Fatal("Materialized.Reported hid the failure")
	}
}
