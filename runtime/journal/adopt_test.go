package journal

import (
	"os"
	"testing"
	"time"
)

// A keeper adopts an orphan once; no recovery claims it while the keeper
// runs, and a live owner's entry cannot be adopted.
func TestAdopt(t *testing.T) {
	adoptWait = 100 * time.Millisecond
	j := Journal{Dir: t.TempDir()}
	e, err := j.Begin(Record{Kind: Materialize, Materialize: &MaterializeRecord{SiblingID: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Adopt(e.Name()); err == nil {
		t.Fatal("adopted the entry of a live owner")
	}
	e.Rec.Owner.StartTime++ // its owner died
	if err := e.Save(); err != nil {
		t.Fatal(err)
	}
	got, err := j.Adopt(e.Name())
	if err != nil || got == nil || got.Rec.Materialize.SiblingID != "s" {
		t.Fatalf("adopt: %+v %v", got, err)
	}
	if again, err := j.Adopt(e.Name()); again != nil || err != nil {
		t.Fatalf("adopted twice: %+v %v", again, err)
	}
	if orphans, _ := j.Orphans(); len(orphans) != 0 {
		t.Fatalf("recovery claimed an adopted entry: %d", len(orphans))
	}
	if err := got.End(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(j.Dir); len(entries) != 0 {
		t.Fatalf("%d entries left", len(entries))
	}
}
