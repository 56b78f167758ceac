package crun

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
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
