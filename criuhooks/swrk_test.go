package criuhooks

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// A CRIU that never answers is killed at the deadline, and OnTimeout runs
// at that moment (the capture thaws its source there), not after the call
// has unwound.
func TestTimeoutKillsCriuAndCallsOnTimeout(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "criu")
	// Not exec: the process must keep the name "criu" to be found.
	os.WriteFile(fake, []byte("#!/bin/sh\nwhile :; do sleep 0.05; done\n"), 0o755)
	var timedOut time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Dump(ctx, Request{
		CriuPath:  fake,
		Opts:      &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1), ImagesDir: proto.String(t.TempDir())},
		OnTimeout: func() { timedOut = time.Now() },
	}, nil)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("error %v, want ErrTimeout", err)
	}
	if timedOut.IsZero() {
		t.Fatal("OnTimeout was not called")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the call took %s to unwind after a 300ms deadline", d)
	}
	if pid, err := criuChild(); err == nil {
		t.Fatalf("criu process %d still running", pid)
	}
}
