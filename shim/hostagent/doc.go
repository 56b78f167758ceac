// Package hostagent does tclone's work on the Podman host for a fork or a
// branch: it inspects the source through the Podman service, leaves the
// fork intent in the host's plan store for the runtime, restores the
// siblings, checks their identity and readiness, keeps branches on disk,
// exports and imports them, and rolls back what a failed call made. tclone's
// API service (shim/cmd/tclone-service) and `podman container fork` run it;
// a remote client uses the light client, shim/podmanfork, instead.
//
// Every call needs root on the host: the call is recorded in the host's
// plan store while it runs (see package runtime/calls), and if its process
// dies, the next fork or `tclone gc` rolls back what it made.
package hostagent

import (
	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/plan"
)

// Agent does the host work on the host whose layout it has.
type Agent struct {
	Layout plan.Layout
}

// New is an agent on layout (plan.HostLayout, built by the caller's main).
func New(layout plan.Layout) *Agent { return &Agent{Layout: layout} }

func (a *Agent) plans() plan.Store { return plan.Store{Layout: a.Layout} }

// Branches is the host's branch store.
func (a *Agent) Branches() branch.Store { return branch.StoreOf(a.Layout) }
