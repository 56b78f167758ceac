package main

import (
	"errors"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
)

// gcReport is what `tclone gc` prints: the runtime's recovery, and the fork
// calls of dead clients rolled back.
type gcReport struct {
	*fork.Recovered
	Calls *calls.Report `json:"fork_calls,omitempty"`
	// Branches is what branch writers that died left, and the data no
	// branch uses any more.
	Branches *branch.Removed `json:"branches,omitempty"`
}

var gcCommand = &cli.Command{
	Name:  "gc",
	Usage: "clean up after interrupted forks and remove expired fork plans",
	Description: `Undoes what a killed tclone left half done (thawing any source it froze,
removing half-made siblings, plans and snapshots), removes plans that no
live fork can use (past their expiry, or held for a fork client that died),
snapshots no plan refers to, fork clients' temporary directories
(/tmp/tclone-fork-*, /tmp/podman-fork-*) whose owners died, lock files
no one holds, the temporary directories and mounts killed CRIUs left in
/tmp (/tmp/.criu.*, only while no CRIU runs), and branches whose writer
died before they were complete, with the branch data no branch uses. Every
fork runs the first part first; run it by hand after a crash to clean up
at once. Prints what it removed as JSON.`,
	Action: func(c *cli.Context) error {
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		engine := engineOf(c, rt)
		r, err := engine.Recover(c.Context)
		if r == nil {
			return err
		}
		// The fork calls of dead clients: their siblings (through
		// Podman), captures, services and temporary directories.
		calls, cerr := calls.Collect(c.Context, engine.Store)
		if calls != nil && len(calls.Kept) > 0 {
			logrus.Warnf("kept %d fork calls of Kubernetes forks for a later gc: their CRI runtime is not reachable (%s)", len(calls.Kept), strings.Join(calls.Kept, "; "))
		}
		branches, berr := branch.StoreOf(hostlayout.Of(c)).Collect()
		if perr := printJSON(gcReport{Recovered: r, Calls: calls, Branches: &branches}); perr != nil {
			return perr
		}
		return errors.Join(err, cerr, berr)
	},
}
