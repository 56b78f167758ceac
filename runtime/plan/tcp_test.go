package plan

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
)

// A plan records its policy even when it is the default, so that every
// sibling made from it, at any later time, closes its copies.
func TestPlanRecordsTCPPolicy(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 1)
	p, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	p.TCP = forkopts.TCPClose
	if err := p.Write(dir); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "plan.json"))
	if !strings.Contains(string(data), `"tcp_policy": "close"`) {
		t.Fatalf("plan.json does not say the policy:\n%s", data)
	}
	if q, err := Read(dir); err != nil || q.TCP != forkopts.TCPClose {
		t.Fatalf("read back %q, %v", q.TCP, err)
	}
}

// tclone leaves the reason a fork capture failed for the client that asked
// for it (by nonce), once; a later fork's client does not see it.
func TestIntentResult(t *testing.T) {
	s := testStore(t)
	in := &Intent{ContainerID: "c1", Nonce: "42-7"}
	if err := s.WriteIntentResult(in, errors.New("capturing c1: the container holds file locks")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TakeIntentResult("c1", "other"); err != nil || got != "" {
		t.Fatalf("another nonce read %q, %v", got, err)
	}
	got, err := s.TakeIntentResult("c1", "42-7")
	if err != nil || !strings.Contains(got, "file locks") {
		t.Fatalf("took %q, %v", got, err)
	}
	if got, err := s.TakeIntentResult("c1", "42-7"); err != nil || got != "" {
		t.Fatalf("taken twice: %q, %v", got, err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if err := s.WriteIntentResult(&Intent{ContainerID: "c1", Nonce: bad}, errors.New("x")); err == nil {
			t.Errorf("nonce %q accepted", bad)
		}
	}
}

// Results no client collected are removed once they are older than an
// intent can live.
func TestStaleIntentResultsAreRemoved(t *testing.T) {
	s := testStore(t)
	if err := s.WriteIntentResult(&Intent{ContainerID: "c1", Nonce: "old"}, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	old, _ := s.intentResultPath("c1", "old")
	past := time.Now().Add(-2 * IntentTTL)
	os.Chtimes(old, past, past)
	if err := s.WriteIntentResult(&Intent{ContainerID: "c2", Nonce: "new"}, errors.New("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale result still there: %v", err)
	}
	if got, _ := s.TakeIntentResult("c2", "new"); got != "y" {
		t.Fatalf("fresh result %q", got)
	}
}
