package lazy

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/plan"
)

// fakeCowPlan is a plan directory whose images the daemon opens at start,
// and two "snapshots": the write ends of pipes, whose read ends see the
// end of the stream once no process holds them any more.
func fakeCowPlan(t *testing.T) (planDir string, snaps *criuhooks.Snapshots, released []*os.File) {
	t.Helper()
	planDir = filepath.Join(t.TempDir(), "plan")
	if err := os.MkdirAll(planDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fakePlan(t), plan.ImagesDir(planDir)); err != nil {
		t.Fatal(err)
	}
	snaps = &criuhooks.Snapshots{Files: map[int32]*os.File{}, AnonPages: 4096, SwapEntries: 3}
	for _, pid := range []int32{1, 7} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		snaps.Files[pid] = w
		released = append(released, r)
	}
	return planDir, snaps, released
}

// held reports whether some process still holds the write end of r.
func held(t *testing.T, r *os.File, wait time.Duration) bool {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(wait))
	_, err := r.Read(make([]byte, 1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return true
	case errors.Is(err, io.EOF):
		return false
	}
	t.Fatalf("reading a snapshot stand-in: %v", err)
	return false
}

func waitReleased(t *testing.T, snaps []*os.File, within time.Duration) {
	t.Helper()
	for _, r := range snaps {
		if held(t, r, within) {
			t.Fatalf("a snapshot is still held %s after its plan ended", within)
		}
	}
}

// A copy-on-write plan's daemon holds the snapshots the capture handed it
// for as long as the plan exists, even with nothing connected; it says so
// to tclone gc (Holders); it stays while a restore is connected after the
// plan is removed, and releases them once that restore is gone.
func TestCowDaemonHoldsSnapshotsWhilePlanLives(t *testing.T) {
	requireRoot(t)
	defer func(share, idle time.Duration) { ShareWait, IdleExit = share, idle }(ShareWait, IdleExit)
	ShareWait, IdleExit = 0, 200*time.Millisecond // no module here: nothing is shared
	layout := plan.LayoutUnder(t.TempDir())
	p := PathsFor(layout, "cowplan")
	planDir, snaps, released := fakeCowPlan(t)

	pid, err := Hold(context.Background(), p, planDir, time.Now().Add(time.Hour), Held{Snapshots: snaps})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	snaps.Close() // the capture's copies: the daemon has its own
	if !held(t, released[0], 3*IdleExit) || !held(t, released[1], 10*time.Millisecond) {
		t.Fatal("the daemon did not keep the snapshots while its plan exists")
	}

	holders, err := Holders(layout)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := holders["cowplan"]
	if !ok || in.Pid != pid || !in.Cow || in.Snapshots != 2 || in.AnonPages != 4096 || in.SwapEntries != 3 {
		t.Fatalf("Holders = %+v, want plan cowplan held by %d with 2 snapshots of 4096 pages, 3 swapped", holders, pid)
	}
	if _, err := Hold(context.Background(), p, planDir, time.Now().Add(time.Hour), Held{Snapshots: snaps}); err == nil || !strings.Contains(err.Error(), "already has a daemon") {
		t.Fatalf("a second Hold for the plan: %v", err)
	}
	if _, err := Ask(p, "share 123456"); err == nil || !strings.Contains(err.Error(), "no sibling") {
		t.Fatalf("share for a pid no sibling has: %v", err)
	}
	if _, err := Ask(p, "bogus"); err == nil || !strings.Contains(err.Error(), "unknown request") {
		t.Fatalf("an unknown request: %v", err)
	}

	c, err := Connect(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(planDir); err != nil {
		t.Fatal(err)
	}
	if !held(t, released[0], 1500*time.Millisecond) {
		t.Fatal("the daemon released the snapshots while a restore was connected")
	}
	c.Close()
	waitReleased(t, released, 5*time.Second)
	waitGone(t, p.Control, 5*time.Second)
	// Hold's waiter reaps it.
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d still runs after releasing its snapshots", pid)
		}
	}
	if _, err := Connect(p); err == nil || !strings.Contains(err.Error(), "memory is gone") {
		t.Fatalf("Connect with the daemon gone: %v", err)
	}
}

// An expired copy-on-write plan's snapshots are released even if no one
// removes the plan.
func TestCowDaemonReleasesAtExpiry(t *testing.T) {
	requireRoot(t)
	defer func(old time.Duration) { ShareWait = old }(ShareWait)
	ShareWait = 0
	p := PathsFor(plan.LayoutUnder(t.TempDir()), "cowplan")
	planDir, snaps, released := fakeCowPlan(t)
	pid, err := Hold(context.Background(), p, planDir, time.Now().Add(1500*time.Millisecond), Held{Snapshots: snaps})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	snaps.Close()
	if !held(t, released[0], 500*time.Millisecond) {
		t.Fatal("released before the plan expired")
	}
	waitReleased(t, released, 5*time.Second)
	if _, err := os.Stat(planDir); err != nil {
		t.Fatalf("the daemon touched the plan: %v", err)
	}
}
