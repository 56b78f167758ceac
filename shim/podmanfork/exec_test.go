package podmanfork

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/libpod/define"
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
