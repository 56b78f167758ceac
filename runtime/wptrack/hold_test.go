package wptrack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	RunHolderIfAsked()
	os.Exit(m.Run())
}

func open(t *testing.T, dir string) *Session {
	t.Helper()
	s, err := Open(context.Background(), dir, "source")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The tracking outlives the capture that armed it, in its holder; the next
// capture takes it back with the baseline its branch committed, and reads
// exactly the pages written since. A commit by a capture that is no longer
// the last to scan changes nothing, and a capture that takes the tracking
// and dies leaves it pending: no baseline.
func TestHoldTakeCommit(t *testing.T) {
	dir := t.TempDir()
	b, base := area(t, 16)
	self := os.Getpid()

	s := open(t, dir)
	got, was, err := s.Take("gen1")
	if err != nil || len(got) != 0 || was != "" {
		t.Fatalf("nothing tracked yet: %v, %q, %v", got, was, err)
	}
	uffd, err := Userfaultfd()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(self, uffd)
	if err != nil {
		t.Fatal(err)
	}
	scan(t, tr, base, 16)
	if err := s.Hold("gen1", self, map[int]*Tracker{self: tr}); err != nil {
		t.Fatal(err)
	}
	holder := s.state.Holder
	t.Cleanup(func() { endProc(holder) })
	s.Close()
	tr.Close() // the holder's copy keeps the tracking

	b[2*pageSize], b[5*pageSize] = 9, 9
	if err := Commit(context.Background(), dir, "source", "gen1", "branch-a"); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	got, was, err = s.Take("gen2")
	if err != nil || was != "branch-a" || got[self] == nil {
		t.Fatalf("second capture: trackers %v, baseline %q, %v; want this process's and branch-a", got, was, err)
	}
	if pages := scan(t, got[self], base, 16); !slices.Equal(pages, []int{2, 5}) {
		t.Fatalf("pages %v written since the first capture, want 2 and 5", pages)
	}
	if err := s.Hold("gen2", self, got); err != nil {
		t.Fatal(err)
	}
	newHolder := s.state.Holder
	t.Cleanup(func() { endProc(newHolder) })
	s.Close()
	closeAll(got)
	deadline := time.Now().Add(5 * time.Second)
	for holder.alive() {
		if time.Now().After(deadline) {
			t.Fatal("the first holder outlived its replacement")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A stale commit: gen1 no longer scanned last.
	if err := Commit(context.Background(), dir, "source", "gen1", "branch-a"); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	got, was, err = s.Take("gen3")
	if err != nil || was != "" {
		t.Fatalf("after a stale commit: baseline %q, %v; want none", was, err)
	}
	closeAll(got)
	s.Close()
	// gen3 took the tracking and never held it (it died): still pending.
	s = open(t, dir)
	got, was, err = s.Take("gen4")
	if err != nil || was != "" {
		t.Fatalf("after a capture that died: baseline %q, %v; want none", was, err)
	}
	closeAll(got)
	endProc(newHolder)
	s.Close()
	// The registration ends with the holder (the kernel may release it a
	// moment after the holder is gone): a new tracker then sees all.
	uffd, err = Userfaultfd()
	if err != nil {
		t.Fatal(err)
	}
	tr, err = New(self, uffd)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	deadline = time.Now().Add(5 * time.Second)
	for {
		rs, err := tr.Scan(base, base+16*pageSize)
		if err == nil {
			if pages := pagesOf(base, rs); len(pages) != 16 {
				t.Fatalf("after Drop, a new tracker's first scan: pages %v, want all 16", pages)
			}
			break
		}
		if err != ErrForeign || time.Now().After(deadline) {
			t.Fatalf("after Drop, a new tracker: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A holder ends with the source's init, and removes the tracking unless
// it was handed to another holder.
func TestHolderEndsWithInit(t *testing.T) {
	for _, handed := range []bool{false, true} {
		dir := t.TempDir()
		init := exec.Command("sleep", "60")
		if err := init.Start(); err != nil {
			t.Fatal(err)
		}
		defer init.Process.Kill()
		s := open(t, dir)
		if err := s.Hold("gen1", init.Process.Pid, nil); err != nil {
			t.Fatal(err)
		}
		holder := s.state.Holder
		if !holder.alive() {
			t.Fatal("no holder")
		}
		if handed {
			// A later capture gave the tracking to another holder: the
			// first one's end leaves that state alone.
			other, err := procOf(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.save(&State{Gen: "gen2", Holder: other}); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		init.Process.Kill()
		init.Wait()
		deadline := time.Now().Add(5 * time.Second)
		for holder.alive() {
			if time.Now().After(deadline) {
				endProc(holder)
				t.Fatal("the holder outlived the source's init")
			}
			time.Sleep(10 * time.Millisecond)
		}
		for _, name := range []string{"source.json", "source.lock"} {
			_, err := os.Stat(filepath.Join(dir, name))
			if handed && err != nil {
				t.Errorf("the holder of a tracking handed on removed %s: %v", name, err)
			}
			if !handed && !os.IsNotExist(err) {
				t.Errorf("%s after the source's init and its holder ended: %v", name, err)
			}
		}
	}
}

// gc removes the tracking states whose holder is gone, and only those.
func TestCollect(t *testing.T) {
	dir := t.TempDir()
	init := exec.Command("sleep", "60")
	if err := init.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { init.Process.Kill(); init.Wait() }()
	for _, source := range []string{"live", "dead"} {
		s, err := Open(context.Background(), dir, source)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Hold("gen", init.Process.Pid, nil); err != nil {
			t.Fatal(err)
		}
		if source == "dead" {
			endProc(s.state.Holder)
		} else {
			holder := s.state.Holder
			t.Cleanup(func() { endProc(holder) })
		}
		s.Close()
	}
	// A capture that failed before it held a tracking left its lock.
	s, err := Open(context.Background(), dir, "failed")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	got, err := Collect(dir)
	if err != nil || !slices.Equal(got, []string{"dead"}) {
		t.Fatalf("collected %v, %v; want the dead one's", got, err)
	}
	for _, gone := range []string{"dead.lock", "failed.lock"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s after Collect: %v", gone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "live.lock")); err != nil {
		t.Errorf("the live one's lock: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "live.json")); err != nil {
		t.Fatalf("the live one's state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "dead.json")); !os.IsNotExist(err) {
		t.Fatalf("the dead one's state: %v", err)
	}
}
