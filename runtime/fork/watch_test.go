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

// With its entry still there, the watchdog undoes what the entry records,
// not the record handed over before: the entry is the one kept up to date.
func TestWatchdogPrefersTheEntry(t *testing.T) {
	l := plan.LayoutUnder(t.TempDir())
	j := journal.Journal{Dir: l.JournalDir()}
	fromEntry, fromRecord := t.TempDir(), t.TempDir()
	e, err := j.Begin(journal.Record{Kind: journal.Materialize, Materialize: &journal.MaterializeRecord{SiblingID: "s", ImagesOverlay: fromEntry}})
	if err != nil {
		t.Fatal(err)
	}
	e.Rec.Owner.StartTime++ // an owner that is gone
	e.Save()
	in := `reporting {"kind":"materialize","materialize":{"sibling_id":"s","images_overlay":"` + fromRecord + `"}}` + "\n"
	var report strings.Builder
	if code := runRestoreWatch(watchConfig{Layout: l, Entry: e.Name()}, strings.NewReader(in), &report); code != 0 {
		t.Fatalf("exit %d: %s", code, report.String())
	}
	if _, err := os.Stat(fromEntry); !os.IsNotExist(err) {
		t.Fatalf("the entry's images overlay is still there (%v)", err)
	}
	if _, err := os.Stat(fromRecord); err != nil {
		t.Fatalf("the handed-over record was used instead of the entry: %v", err)
	}
}

// An entry another recovery has claimed is that recovery's to undo.
func TestWatchdogLeavesAnEntryClaimedElsewhere(t *testing.T) {
	l := plan.LayoutUnder(t.TempDir())
	if err := os.MkdirAll(l.JournalDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	name := "materialize-1-1.json"
	claimed := journal.ClaimedBy(l.JournalDir()+"/"+name, journal.Owner{Pid: 1, StartTime: 1})
	if err := os.WriteFile(claimed, []byte(`{"kind":"materialize"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var report strings.Builder
	in := `reporting {"kind":"materialize","materialize":{"sibling_id":"s1"}}` + "\n"
	if code := runRestoreWatch(watchConfig{Layout: l, Entry: name}, strings.NewReader(in), &report); code != 0 || report.Len() != 0 {
		t.Fatalf("exit %d, report %q: the watchdog acted on an entry claimed elsewhere", code, report.String())
	}
}
