package plan

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
)

// deadOwner names a process that no longer runs: this one, born at another
// time.
func deadOwner() journal.Owner {
	o := journal.Self()
	o.StartTime++
	return o
}

// A plan held for a client that died is removed at the next sweep, not at
// its expiry, unless a restore still holds a use; and no new use is given.
func TestPlanOfDeadClientIsSwept(t *testing.T) {
	s := testStore(t)
	client, die := childOwner(t)
	dir := newPlanFor(t, s, 3, &client)
	held, err := s.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	die()
	if removed, err := s.Sweep(dir, time.Now()); removed != "" || err != nil {
		t.Fatalf("swept a plan a restore still uses: %q %v", removed, err)
	}
	if _, err := s.Acquire(dir); !errors.Is(err, ErrClientGone) {
		t.Fatalf("a plan of a dead client gave a use: %v", err)
	}
	// The restore in flight finishes: nothing else can use the plan.
	if err := held.Release(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the plan outlived its dead client's last restore")
	}

	dead := deadOwner()
	dir = newPlanFor(t, s, Unlimited, &dead)
	if removed, err := s.Sweep(dir, time.Now()); removed != SweptClientGone || err != nil {
		t.Fatalf("sweep of an idle plan of a dead client: %q %v", removed, err)
	}
}

// childOwner starts a process to stand for a fork client, and a function
// that ends it.
func childOwner(t *testing.T) (journal.Owner, func()) {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	die := func() { cmd.Process.Kill(); cmd.Wait() }
	t.Cleanup(die)
	o, ok := journal.OwnerOf(cmd.Process.Pid)
	if !ok {
		t.Fatal("the stand-in client is gone")
	}
	return o, die
}

// A plan held for a live client waits for its uses or its expiry.
func TestPlanOfLiveClientIsKept(t *testing.T) {
	s := testStore(t)
	self := journal.Self()
	dir := newPlanFor(t, s, 2, &self)
	if removed, err := s.Sweep(dir, time.Now()); removed != "" || err != nil {
		t.Fatalf("swept a live client's plan: %q %v", removed, err)
	}
	if removed, _ := s.Sweep(dir, time.Now().Add(2*time.Hour)); removed != SweptExpired {
		t.Fatalf("an expired plan of a live client: %q", removed)
	}
}

// The intent names the process that left it.
func TestIntentRecordsItsClient(t *testing.T) {
	s := testStore(t)
	if err := s.WriteIntent(Intent{ContainerID: "c", Nonce: "n"}); err != nil {
		t.Fatal(err)
	}
	in, err := s.TakeIntent("c")
	if err != nil || in == nil {
		t.Fatalf("%+v %v", in, err)
	}
	if in.Client != journal.Self() {
		t.Fatalf("intent client %+v, want %+v", in.Client, journal.Self())
	}
}

// gc removes a lock file no one holds, and keeps a held one.
func TestCollectLocks(t *testing.T) {
	s := testStore(t)
	held, err := Lock(context.Background(), filepath.Join(s.LocksDir(), "held.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer held()
	free, err := Lock(context.Background(), filepath.Join(s.LocksDir(), "free.lock"))
	if err != nil {
		t.Fatal(err)
	}
	free()
	removed, err := s.CollectLocks()
	if err != nil || len(removed) != 1 || filepath.Base(removed[0]) != "free.lock" {
		t.Fatalf("collected %v, %v; want only free.lock", removed, err)
	}
	if _, err := os.Stat(filepath.Join(s.LocksDir(), "held.lock")); err != nil {
		t.Fatalf("a held lock was removed: %v", err)
	}
}
