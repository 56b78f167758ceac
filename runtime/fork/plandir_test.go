package fork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/plan"
)

// An imported checkpoint cannot point tclone at host paths: a reference's
// plan directory is ignored in favour of its ID in this store, and a plan.json
// outside the store is just a file.
func TestPlanDirForTrustsOnlyTheStore(t *testing.T) {
	e := testEngine(t)

	ordinary := t.TempDir()
	os.WriteFile(filepath.Join(ordinary, "plan.json"), []byte(`{"version":1}`), 0o600)
	if dir, err := e.PlanDirFor(ordinary); dir != "" || err != nil {
		t.Fatalf("a plan.json outside the store made %s a plan (%v)", dir, err)
	}

	forged := t.TempDir()
	plan.WriteReference(forged, plan.Reference{PlanID: "../../etc", PlanDir: "/etc"})
	if dir, err := e.PlanDirFor(forged); !errors.Is(err, plan.ErrNotInStore) {
		t.Fatalf("a forged reference resolved to %q (%v)", dir, err)
	}

	id := plan.NewID()
	honest := t.TempDir()
	plan.WriteReference(honest, plan.Reference{PlanID: id, PlanDir: "/somewhere/else"})
	if dir, err := e.PlanDirFor(honest); err != nil || dir != e.Store.Dir(id) {
		t.Fatalf("reference resolved to %q (%v), want %s", dir, err, e.Store.Dir(id))
	}
	if dir, err := e.PlanDirFor(filepath.Join(e.Store.Dir(id), "images")); err != nil || dir != e.Store.Dir(id) {
		t.Fatalf("images path resolved to %q (%v)", dir, err)
	}
}

func TestMaterializeNeedsDetach(t *testing.T) {
	e := &Engine{}
	_, err := e.Materialize(context.Background(), MaterializeRequest{Plan: plan.NewID(), ID: "x", Bundle: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--detach") {
		t.Fatalf("foreground restore from a plan: %v", err)
	}
}
