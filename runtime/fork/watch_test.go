package fork

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

func TestReadWatchProtocol(t *testing.T) {
	watched, reporting, done := readWatchProtocol(strings.NewReader("watch 12 345\nbogus\nwatch x 1\nreporting {bad\n"))
	if done || reporting != nil || len(watched) != 1 || watched[0] != (journal.Owner{Pid: 12, StartTime: 345}) {
		t.Fatalf("end of input: %+v %v %v", watched, reporting, done)
	}
	if _, _, done := readWatchProtocol(strings.NewReader("watch 12 345\ndone\n")); !done {
		t.Fatal("done not seen")
	}
	_, reporting, done = readWatchProtocol(strings.NewReader(`reporting {"kind":"materialize","materialize":{"sibling_id":"s1"}}` + "\n"))
	if done || reporting == nil || reporting.Materialize == nil || reporting.Materialize.SiblingID != "s1" {
		t.Fatalf("reporting record: %+v %v", reporting, done)
	}
}

// A watchdog whose restore finished touches nothing, even with an entry
// that would be an orphan.
func TestWatchdogDoneTouchesNothing(t *testing.T) {
	l := plan.LayoutUnder(t.TempDir())
	j := journal.Journal{Dir: l.JournalDir()}
	e, err := j.Begin(journal.Record{Kind: journal.Materialize, Materialize: &journal.MaterializeRecord{SiblingID: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	e.Rec.Owner.StartTime++
	e.Save()
	cfg := watchConfig{Layout: l, Entry: e.Name()}
	if code := runRestoreWatch(cfg, strings.NewReader("done\n"), io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if orphans, _ := j.Orphans(); len(orphans) != 1 {
		t.Fatal("the entry was touched")
	}
}

// A watchdog whose restore died undoes what the entry records and ends it.
func TestWatchdogUndoesAfterDeath(t *testing.T) {
	l := plan.LayoutUnder(t.TempDir())
	j := journal.Journal{Dir: l.JournalDir()}
	overlay := t.TempDir()
	e, err := j.Begin(journal.Record{Kind: journal.Materialize, Materialize: &journal.MaterializeRecord{SiblingID: "s", ImagesOverlay: overlay}})
	if err != nil {
		t.Fatal(err)
	}
	e.Rec.Owner.StartTime++
	e.Save()
	cfg := watchConfig{Layout: l, Entry: e.Name()}
	var report strings.Builder
	if code := runRestoreWatch(cfg, strings.NewReader("watch 999999999 1\n"), &report); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(report.String(), "s died before the sibling was complete; the half-made sibling was removed") {
		t.Errorf("report %q", report.String())
	}
	if orphans, _ := j.Orphans(); len(orphans) != 0 {
		t.Fatal("the entry is still there")
	}
	if _, err := os.Stat(overlay); err == nil {
		t.Fatal("the sibling's image directory is still there")
	}
}

// A tclone that died after it ended its journal entry, and before it
// released its watchdog, never exited 0: its caller saw a failure. The
// watchdog undoes the sibling from the record handed over first.
func TestWatchdogUndoesFromReportingRecord(t *testing.T) {
	l := plan.LayoutUnder(t.TempDir())
	var report strings.Builder
	cfg := watchConfig{Layout: l, Entry: "materialize-1-1.json"}
	in := `reporting {"kind":"materialize","materialize":{"sibling_id":"s1"}}` + "\n"
	if code := runRestoreWatch(cfg, strings.NewReader(in), &report); code != 0 {
		t.Fatalf("exit %d: %s", code, report.String())
	}
	if !strings.Contains(report.String(), "tclone restore of s1 died before the sibling was complete") {
		t.Fatalf("report %q", report.String())
	}
	// Without the record, an entry that is gone leaves nothing to do.
	report.Reset()
	if code := runRestoreWatch(cfg, strings.NewReader(""), &report); code != 0 || report.Len() != 0 {
		t.Fatalf("exit %d, report %q", code, report.String())
	}
}
