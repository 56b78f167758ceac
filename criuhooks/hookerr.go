package criuhooks

import (
	"fmt"

	criu "github.com/checkpoint-restore/go-criu/v7"
)

// HookError is the error one of tclone's hooks returned to CRIU. CRIU only
// logs that "one of more action scripts failed" and stops; the hook's own
// error is the reason, and Error shows it first.
type HookError struct {
	Hook string // pre-dump, post-dump, network-lock, ...
	Err  error
}

func (e *HookError) Error() string { return fmt.Sprintf("tclone's %s hook: %v", e.Hook, e.Err) }

func (e *HookError) Unwrap() error { return e.Err }

// namedHooks tags every error its hooks return with the hook's name.
type namedHooks struct{ n criu.Notify }

func tag(hook string, err error) error {
	if err == nil {
		return nil
	}
	return &HookError{Hook: hook, Err: err}
}

func (h namedHooks) PreDump() error              { return tag("pre-dump", h.n.PreDump()) }
func (h namedHooks) PostDump() error             { return tag("post-dump", h.n.PostDump()) }
func (h namedHooks) PreRestore() error           { return tag("pre-restore", h.n.PreRestore()) }
func (h namedHooks) PostRestore(pid int32) error { return tag("post-restore", h.n.PostRestore(pid)) }
func (h namedHooks) NetworkLock() error          { return tag("network-lock", h.n.NetworkLock()) }
func (h namedHooks) NetworkUnlock() error        { return tag("network-unlock", h.n.NetworkUnlock()) }
func (h namedHooks) SetupNamespaces(pid int32) error {
	return tag("setup-namespaces", h.n.SetupNamespaces(pid))
}
func (h namedHooks) PostSetupNamespaces() error {
	return tag("post-setup-namespaces", h.n.PostSetupNamespaces())
}
func (h namedHooks) PostResume() error { return tag("post-resume", h.n.PostResume()) }
func (h namedHooks) DumpResumed() error {
	if r, ok := h.n.(resumedNotify); ok {
		return tag("dump-resumed", r.DumpResumed())
	}
	return nil
}
