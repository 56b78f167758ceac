package fork

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// startClient is a process standing in for a fork client.
func startClient(t *testing.T) (*exec.Cmd, journal.Owner) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	owner, ok := journal.OwnerOf(cmd.Process.Pid)
	if !ok {
		t.Fatal("the client process is gone already")
	}
	return cmd, owner
}

func requireCause(t *testing.T, ctx context.Context, want error) {
	t.Helper()
	select {
	case <-ctx.Done():
		if got := context.Cause(ctx); !errors.Is(got, want) {
			t.Fatalf("capture context ended with %v, want %v", got, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("capture context still open a minute after: %v", want)
	}
}

// countChecks counts whileClientWaits's rounds that found the client still
// waiting; the returned wait blocks until n more have passed.
func countChecks(t *testing.T) (wait func(n int)) {
	t.Helper()
	rounds := make(chan struct{}, 1024)
	clientChecked = func() { rounds <- struct{}{} }
	t.Cleanup(func() { clientChecked = func() {} })
	return func(n int) {
		t.Helper()
		for range n {
			select {
			case <-rounds:
			case <-time.After(time.Minute):
				t.Fatal("the client watch stopped checking")
			}
		}
	}
}

func TestCaptureStopsWhenItsClientDies(t *testing.T) {
	e := testEngine(t)
	checked := countChecks(t)
	cmd, owner := startClient(t)
	intent := &plan.Intent{ContainerID: "c1", Nonce: "n1", Client: owner}
	ctx, stop := e.whileClientWaits(context.Background(), intent)
	defer stop()
	checked(3)
	if ctx.Err() != nil {
		t.Fatalf("capture context ended while its client runs: %v", context.Cause(ctx))
	}
	cmd.Process.Kill()
	requireCause(t, ctx, errClientGone)
}

func TestCaptureStopsWhenItsClientCancels(t *testing.T) {
	e := testEngine(t)
	checked := countChecks(t)
	_, owner := startClient(t)
	intent := &plan.Intent{ContainerID: "c1", Nonce: "n1", Client: owner}
	ctx, stop := e.whileClientWaits(context.Background(), intent)
	if err := e.Store.CancelIntent("c1", "n2"); err != nil {
		t.Fatal(err)
	}
	checked(3)
	if ctx.Err() != nil {
		t.Fatal("another intent's cancellation ended this capture")
	}
	if err := e.Store.CancelIntent("c1", "n1"); err != nil {
		t.Fatal(err)
	}
	requireCause(t, ctx, errClientCancelled)
	stop()
	if e.Store.IntentCancelled(intent) {
		t.Error("the cancellation is left after the capture ended")
	}
	e.Store.RemoveIntentCancel("c1", "n2")
	if left, _ := os.ReadDir(e.Store.IntentsDir()); len(left) != 0 {
		t.Errorf("intent files left: %v", left)
	}
}

func TestCaptureForAGoneClientStopsAtOnce(t *testing.T) {
	e := testEngine(t)
	cmd, owner := startClient(t)
	cmd.Process.Kill()
	cmd.Wait()
	ctx, stop := e.whileClientWaits(context.Background(), &plan.Intent{ContainerID: "c1", Nonce: "n1", Client: owner})
	defer stop()
	requireCause(t, ctx, errClientGone)
}
