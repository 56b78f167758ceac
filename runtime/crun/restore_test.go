package crun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/cgroups"
)

func fakeCrun(t *testing.T, script string) *Runtime {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "crun")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Runtime{Path: bin, Global: Global{Root: t.TempDir()}}
}

// An ordinary restore passes on what the caller signals to crun, and crun's
// exit status back.
func TestRestoreCheckpointForwardsSignals(t *testing.T) {
	e := fakeCrun(t, "trap 'exit 42' WINCH\nwhile :; do sleep 0.05; done\n")
	done := make(chan error, 1)
	go func() { done <- e.RestoreCheckpoint(context.Background(), "x", t.TempDir(), nil, nil) }()
	var err error
	// WINCH is harmless to this test process before the forwarding is in
	// place, so it is sent until crun reacts.
	for waiting := true; waiting; {
		syscall.Kill(os.Getpid(), syscall.SIGWINCH)
		select {
		case err = <-done:
			waiting = false
		case <-time.After(50 * time.Millisecond):
		}
	}
	var st *ExitStatus
	if !errors.As(err, &st) || st.Code != 42 {
		t.Fatalf("error %v, want crun's exit status 42", err)
	}
}

// A crun killed by a signal is reported as a shell would: 128+N.
func TestRestoreCheckpointSignalExitStatus(t *testing.T) {
	e := fakeCrun(t, "kill -KILL $$\n")
	err := e.RestoreCheckpoint(context.Background(), "x", t.TempDir(), nil, nil)
	var st *ExitStatus
	if !errors.As(err, &st) || st.Code != 128+9 {
		t.Fatalf("error %v, want exit status 137", err)
	}
}

// A restore passes the caller's arguments and environment to crun, with
// the container's ID last.
func TestRestoreCheckpointArgs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	e := fakeCrun(t, `echo "$FOO $*" > `+out)
	if err := e.RestoreCheckpoint(context.Background(), "x", t.TempDir(), []string{"--bundle", "/b"}, []string{"FOO=bar"}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if want := "bar --root=" + e.Global.Root + " restore --bundle /b x\n"; string(got) != want {
		t.Errorf("crun got %q, want %q", got, want)
	}
}

// scratchCgroup makes a cgroup, with a child, in the pids hierarchy (a
// test leaves the others alone), and returns its path and directory.
func scratchCgroup(t *testing.T) (path, dir string) {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	path = "/tclone-unit-test-" + hex.EncodeToString(b)
	dir = filepath.Join(cgroups.Root, "pids", path)
	if cgroups.Unified() {
		dir = filepath.Join(cgroups.Root, path)
	}
	for _, d := range []string{dir, filepath.Join(dir, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{filepath.Join(dir, "sub"), dir} {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("removing scratch cgroup %s: %v", d, err)
			}
		}
	})
	return path, dir
}

// bundle writes a bundle whose container is put in the cgroup path.
func bundle(t *testing.T, cgroupPath string) string {
	t.Helper()
	dir := t.TempDir()
	spec, _ := json.Marshal(specs.Spec{Linux: &specs.Linux{CgroupsPath: cgroupPath}})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A failed restore leaves no cgroup behind for the next container of the
// same path, unless crun kept a container under the ID; either way crun's
// status is passed on.
func TestRestoreCheckpointRemovesLeftoverCgroup(t *testing.T) {
	for _, kept := range []bool{false, true} {
		e := fakeCrun(t, "exit 5")
		if kept {
			if err := os.Mkdir(filepath.Join(e.Global.Root, "x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		path, dir := scratchCgroup(t)
		err := e.RestoreCheckpoint(context.Background(), "x", bundle(t, path), nil, nil)
		var st *ExitStatus
		if !errors.As(err, &st) || st.Code != 5 || err.Error() != "crun restore of x failed" {
			t.Errorf("kept=%v: %v, want crun's exit status 5", kept, err)
		}
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) == kept {
			t.Errorf("kept=%v: after the failed restore, cgroup %s: %v", kept, dir, err)
		}
	}
}
