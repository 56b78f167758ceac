package hostagent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/libpod/define"

	"github.com/tclone/tclone/shim/podmanfork"
)

// The attach stream of an exec is given up once the session is seen to
// have exited, when the stream does not end by itself; a stream that ends
// is waited for.
func TestWaitExec(t *testing.T) {
	states := func(seq ...define.InspectExecSession) func(context.Context) (*define.InspectExecSession, error) {
		i := 0
		return func(context.Context) (*define.InspectExecSession, error) {
			s := seq[min(i, len(seq)-1)]
			i++
			return &s, nil
		}
	}
	never := make(chan error)
	start := time.Now()
	ended, err := waitExec(context.Background(), states(define.InspectExecSession{Running: true}, define.InspectExecSession{}), never)
	if err == nil || !ended || !strings.Contains(err.Error(), "kept its output stream open") || time.Since(start) < attachGrace {
		t.Fatalf("a stream left open after the command exited: %v after %s", err, time.Since(start))
	}
	// Exited with a code before it was seen running.
	if ended, err := waitExec(context.Background(), states(define.InspectExecSession{ExitCode: 3}), never); err == nil || !ended {
		t.Fatal("a stream left open after a failed command was waited for")
	}
	// A stream that ends is the answer.
	closed := make(chan error, 1)
	closed <- nil
	if ok, err := waitExec(context.Background(), states(define.InspectExecSession{Running: true}), closed); err != nil || !ok {
		t.Fatal(err)
	}
	// Nothing to tell: the context bounds the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// Nor can its exit status be trusted: it may never have started.
	if ended, err := waitExec(ctx, states(define.InspectExecSession{}), never); err == nil || ended || !strings.Contains(err.Error(), "did not end") {
		t.Fatalf("a session that says nothing: %v, ended %v", err, ended)
	}
}

// An attempt of --ready exec whose stream never ends is given up after
// its bound, and a new one is made: the readiness wait does not spend its
// whole timeout on one stuck session.
func TestReadyExecRetriesAStuckAttempt(t *testing.T) {
	defer func(a time.Duration, run func(context.Context, string, []string) (*execResult, error)) {
		readyExecAttempt, runExec = a, run
	}(readyExecAttempt, runExec)
	readyExecAttempt = 100 * time.Millisecond
	var attempts int
	runExec = func(ctx context.Context, id string, argv []string) (*execResult, error) {
		attempts++
		if attempts == 1 {
			<-ctx.Done() // the service keeps the stream open
			return nil, ctx.Err()
		}
		return &execResult{code: 0}, nil
	}
	f := &forker{opts: podmanfork.Options{Ready: podmanfork.Ready{Kind: podmanfork.ReadyExec}}, start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := &podmanfork.Result{ID: "sibling"}
	if err := f.ready(ctx, r); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if attempts != 2 || r.FirstCommandMs == 0 {
		t.Fatalf("%d attempts, first command at %v ms; want a second attempt that answered", attempts, r.FirstCommandMs)
	}
}
