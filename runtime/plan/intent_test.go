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

// The pause of a fork's checkpoint caller is claimed once per intent, only
// for an intent whose caller pauses (containerd's); the claim and the mark
// of the capture's release go with the intent's removal or, left behind,
// once they are stale.
func TestClaimCallerPause(t *testing.T) {
	s := testStore(t)
	claim := func(id string) bool {
		t.Helper()
		ok, err := s.ClaimCallerPause(id)
		if err != nil {
			t.Fatalf("claiming the pause of %s: %v", id, err)
		}
		return ok
	}
	if claim("none") {
		t.Error("a pause claimed with no intent")
	}
	for _, in := range []Intent{
		{ContainerID: "cri", Nonce: "a", CallerPaused: true},
		{ContainerID: "podman", Nonce: "b"},
		{ContainerID: "expired", Nonce: "c", CallerPaused: true, ExpiresAt: time.Now().Add(-time.Second)},
	} {
		if err := s.WriteIntent(in); err != nil {
			t.Fatal(err)
		}
	}
	if !claim("cri") {
		t.Fatal("the first pause of a caller-paused intent was not the fork's")
	}
	if claim("cri") {
		t.Error("a second pause of the same intent was the fork's too (it must freeze)")
	}
	if claim("podman") || claim("expired") {
		t.Error("a pause claimed for an intent whose caller does not pause, or an expired one")
	}
	// A later intent of the same container has a pause of its own.
	if err := s.WriteIntent(Intent{ContainerID: "cri", Nonce: "d", CallerPaused: true}); err != nil {
		t.Fatal(err)
	}
	if !claim("cri") {
		t.Error("a later intent's pause was not claimed")
	}
	// The capture tells its client it is done.
	if s.IntentReleased("cri", "a") {
		t.Error("an intent released before its capture said so")
	}
	if err := s.MarkIntentReleased(&Intent{ContainerID: "cri", Nonce: "a", CallerPaused: true}); err != nil {
		t.Fatal(err)
	}
	if !s.IntentReleased("cri", "a") || s.IntentReleased("cri", "d") {
		t.Error("the release of one intent's capture is not its own")
	}
	// A client whose checkpoint's caller does not pause waits for no
	// release: none is left for it.
	if err := s.MarkIntentReleased(&Intent{ContainerID: "podman", Nonce: "b"}); err != nil || s.IntentReleased("podman", "b") {
		t.Errorf("a release marked for a Podman fork (%v)", err)
	}
	if err := s.RemoveIntent("cri", "a"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cri.a.pause", "cri.a.released"} {
		if _, err := os.Stat(filepath.Join(s.IntentsDir(), f)); !os.IsNotExist(err) {
			t.Errorf("%s of a removed intent is left: %v", f, err)
		}
	}
	// The intent taken by its checkpoint, and its client killed before it
	// removed it: the claim goes once stale.
	if in, err := s.TakeIntent("cri"); err != nil || in == nil || in.Nonce != "d" {
		t.Fatalf("taking the intent: %+v, %v", in, err)
	}
	left := filepath.Join(s.IntentsDir(), "cri.d.pause")
	old := time.Now().Add(-2 * IntentTTL)
	os.Chtimes(left, old, old)
	if _, err := s.CollectIntents(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("a stale claim is left: %v", err)
	}
	// A client killed with its claim and its release fresh: they go at the
	// next collection, as its intent does.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := journal.Owner{Pid: dead.Process.Pid, StartTime: 1}
	in := Intent{ContainerID: "killed", Nonce: "e", CallerPaused: true, Client: gone}
	if err := s.WriteIntent(in); err != nil {
		t.Fatal(err)
	}
	if !claim("killed") {
		t.Fatal("the killed client's pause was not claimed")
	}
	if err := s.MarkIntentReleased(&in); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CollectIntents(); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(s.IntentsDir(), "killed*")); len(m) > 0 {
		t.Errorf("what a killed client's intent left: %v", m)
	}
}
