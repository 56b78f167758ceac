package fork

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// Recovery thaws a source only when its capture's journal says it may have
// left it frozen: a container the user paused later stays paused.
func TestRecoveryThawsOnlyWhatItFroze(t *testing.T) {
	for _, c := range []struct {
		phase string
		want  string
	}{
		{phaseFrozen, "THAWED"},
		{phaseDumped, "FROZEN"},
	} {
		root := t.TempDir()
		e := &Engine{
			Store:   plan.Store{Root: root, SnapshotRoot: filepath.Join(root, "snap")},
			Journal: journal.Journal{Dir: filepath.Join(root, "journal")},
		}
		freezer := t.TempDir()
		state := filepath.Join(freezer, "freezer.state")
		os.WriteFile(state, []byte("FROZEN"), 0o644)
		entry, err := e.Journal.Begin(journal.Record{Kind: journal.Capture, Phase: c.phase, FreezerDir: freezer, SourceID: "src"})
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
