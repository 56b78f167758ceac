package plan

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
)

func TestCollectIntentsKeepsOnlyWantedOnes(t *testing.T) {
	s := testStore(t)
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	liveOwner, _ := journal.OwnerOf(live.Process.Pid)
	deadOwner := journal.Owner{Pid: dead.Process.Pid, StartTime: 1}
	for _, in := range []Intent{
		{ContainerID: "live", Nonce: "a", Client: liveOwner},
		{ContainerID: "dead", Nonce: "b", Client: deadOwner},
		{ContainerID: "expired", Nonce: "c", Client: liveOwner, ExpiresAt: time.Now().Add(-time.Second)},
		{ContainerID: "locked", Nonce: "d", Client: deadOwner},
	} {
		if err := s.WriteIntent(in); err != nil {
			t.Fatal(err)
		}
	}
	// A client between its intent and its checkpoint holds the lock.
	unlock, err := Lock(context.Background(), filepath.Join(s.LocksDir(), "intent-locked.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	// A cancellation past its time.
	if err := s.CancelIntent("dead", "b"); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * IntentTTL)
	cancelFile := filepath.Join(s.IntentsDir(), "dead.b.cancel")
	os.Chtimes(cancelFile, old, old)

	// A result for the dead client, which nobody will read, and one for
	// the live one.
	for _, in := range []*Intent{{ContainerID: "dead", Nonce: "b", Client: deadOwner}, {ContainerID: "live", Nonce: "a", Client: liveOwner}} {
		if err := s.WriteIntentResult(in, os.ErrInvalid); err != nil {
			t.Fatal(err)
		}
	}

	// An intent a killed checkpoint was taking (its PID ends the name).
	taken := filepath.Join(s.IntentsDir(), "gone.json.taken"+strconv.Itoa(dead.Process.Pid))
	if err := os.WriteFile(taken, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}

	removed, err := s.CollectIntents()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"dead", "expired"}) {
		t.Errorf("removed %v, want [dead expired]", removed)
	}
	for id, want := range map[string]bool{"live": true, "dead": false, "expired": false, "locked": true} {
		_, err := os.Stat(s.intentPath(id))
		if got := err == nil; got != want {
			t.Errorf("intent of %s kept = %v, want %v", id, got, want)
		}
	}
	if _, err := os.Stat(cancelFile); err == nil {
		t.Error("a stale cancellation was kept")
	}
	if _, err := os.Stat(taken); err == nil {
		t.Error("the intent a dead checkpoint was taking was kept")
	}
	if why, _ := s.TakeIntentResult("dead", "b"); why != "" {
		t.Error("the result for a dead client was kept")
	}
	if why, _ := s.TakeIntentResult("live", "a"); why == "" {
		t.Error("the result for a live client was removed")
	}
}
