package criuhooks

import (
	"errors"
	"strings"
	"testing"
)

// A failed hook is named first in the error, ahead of CRIU's log, which
// only says that an action script failed; errors.Is still reaches the
// hook's own error.
func TestHookErrorIsTheReason(t *testing.T) {
	cause := errors.New("copying volume data: no space left on device")
	h := namedHooks{failingNotify{cause}}
	err := &Error{Op: "dump", Err: h.PostDump(), Reasons: []string{"Error (criu/action-scripts.c:156): One of more action scripts failed"}}
	msg := err.Error()
	if !strings.HasPrefix(msg, "criu dump failed: tclone's post-dump hook: copying volume data") || !strings.Contains(msg, "action scripts failed") {
		t.Fatalf("error %q does not lead with the hook's error", msg)
	}
	if !errors.Is(err, cause) {
		t.Fatalf("errors.Is does not reach the hook's error through %q", msg)
	}
	if h.PreDump() != nil {
		t.Fatal("a hook that succeeded was tagged as failed")
	}
}

type failingNotify struct{ err error }

func (f failingNotify) PreDump() error              { return nil }
func (f failingNotify) PostDump() error             { return f.err }
func (f failingNotify) PreRestore() error           { return nil }
func (f failingNotify) PostRestore(int32) error     { return nil }
func (f failingNotify) NetworkLock() error          { return nil }
func (f failingNotify) NetworkUnlock() error        { return nil }
func (f failingNotify) SetupNamespaces(int32) error { return nil }
func (f failingNotify) PostSetupNamespaces() error  { return nil }
func (f failingNotify) PostResume() error           { return nil }
