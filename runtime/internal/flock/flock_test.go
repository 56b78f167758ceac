package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLockExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l")
	unlock, err := Lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a held lock was taken again: %v", err)
	}
	if _, ok, err := TryLock(path); ok || err != nil {
		t.Fatalf("TryLock took a held lock: %v %v", ok, err)
	}
	unlock()
	if u, ok, err := TryLock(path); !ok || err != nil {
		t.Fatalf("TryLock of a free lock: %v %v", ok, err)
	} else {
		u()
	}
}

// A context that is already done still takes a free lock.
func TestLockDoneContextTakesFreeLock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	unlock, err := Lock(ctx, filepath.Join(t.TempDir(), "l"))
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}

// A waiter in the kernel (Background) gets the lock as soon as it is free.
func TestLockBlockingWaiter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l")
	unlock, err := Lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func())
	go func() {
		u, err := Lock(context.Background(), path)
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("the waiter got a held lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never got the lock")
	}
}

// A waiter whose file is unlinked under it by the holder locks the file
// now at the path, so it still excludes every later locker.
func TestLockSurvivesUnlink(t *testing.T) {
	for _, name := range []string{"polling", "blocking"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "l")
			holder, err := Lock(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if name == "polling" {
				var cancel func()
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			got := make(chan func())
			go func() {
				u, err := Lock(ctx, path)
				if err != nil {
					t.Error(err)
				}
				got <- u
			}()
			waitOpen(t, path, 2) // the holder's and the waiter's, the old file
			os.Remove(path)
			holder()
			var unlock func()
			select {
			case unlock = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter never got the lock")
			}
			defer unlock()
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("the waiter holds a lock on no file at the path: %v", err)
			}
			if _, ok, _ := TryLock(path); ok {
				t.Fatal("the waiter's lock excludes no one")
			}
		})
	}
}

// A lock whose directory went with its holder is gone, not recreated.
func TestLockDirectoryGone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plan")
	os.Mkdir(dir, 0o700)
	path := filepath.Join(dir, "lock")
	holder, err := Lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() {
		_, err := Lock(context.Background(), path)
		got <- err
	}()
	waitOpen(t, path, 2)
	os.RemoveAll(dir)
	holder()
	if err := <-got; !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the lock's directory was made again")
	}
}

func TestTryLockMissing(t *testing.T) {
	if _, ok, err := TryLock(filepath.Join(t.TempDir(), "none")); ok || err != nil {
		t.Fatalf("%v %v", ok, err)
	}
}

// waitOpen waits until this process has n descriptors open on the file at
// path: a waiter in Lock opens the file before it waits for its lock.
func waitOpen(t *testing.T, path string, n int) {
	t.Helper()
	open := func() int {
		fds, _ := filepath.Glob("/proc/self/fd/*")
		c := 0
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && target == path {
				c++
			}
		}
		return c
	}
	for deadline := time.Now().Add(time.Minute); open() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open on %s, not %d", open(), path, n)
		}
	}
}
