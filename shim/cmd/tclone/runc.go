package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/fork"
)

// runc's flag dialect: containerd's runc v2 shim (io.containerd.runc.v2,
// through go-runc) runs tclone as it runs runc when a runtime class names
// tclone as its BinaryName. The verbs tclone hands to crun take runc's
// flags as they are (crun accepts every one the shim sends); checkpoint and
// restore, which tclone parses itself, declare the rest here: accepted and
// ignored where nothing needs doing, refused with why where tclone cannot
// do what they ask.

// runcRestoreFlags are the restore flags go-runc may send that crun lacks.
var runcRestoreFlags = []cli.Flag{
	// The shim sends -no-subreaper on every restore. Neither tclone nor
	// crun makes itself a subreaper, so there is nothing to turn off:
	// accepted on purpose.
	&cli.BoolFlag{Name: "no-subreaper", Usage: "(runc) accepted and ignored: tclone never makes itself a subreaper"},
	&cli.BoolFlag{Name: "no-pivot", Usage: "(runc) refused: crun restores with pivot_root"},
	&cli.StringSliceFlag{Name: "empty-ns", Usage: "(runc) refused: CRIU restores every namespace the images name"},
	&cli.BoolFlag{Name: "lazy-pages", Usage: "(runc) refused: give --memory lazy to a fork instead"},
}

// runcCheckpointFlags are the checkpoint flags go-runc may send that crun
// lacks.
var runcCheckpointFlags = []cli.Flag{
	&cli.StringSliceFlag{Name: "empty-ns", Usage: "(runc) refused: CRIU dumps every namespace of the container"},
	&cli.BoolFlag{Name: "lazy-pages", Usage: "(runc) refused: forks take --memory lazy"},
	&cli.StringFlag{Name: "page-server", Usage: "(runc) refused: images are written to --image-path"},
	&cli.IntFlag{Name: "status-fd", Usage: "(runc) refused: no page server to report on"},
}

// refuseRunc fails when c has one of runc's flags that tclone cannot honour,
// naming it and saying what to do instead.
func refuseRunc(c *cli.Context) error {
	why := map[string]string{
		"no-pivot":    "crun restores with pivot_root: leave the runtime's NoPivotRoot option unset",
		"empty-ns":    "CRIU dumps and restores every namespace the container has",
		"lazy-pages":  "lazy memory is a fork's (tclone fork --memory lazy), not a runc option here",
		"page-server": "tclone writes CRIU's images to --image-path only",
		"status-fd":   "tclone runs no page server to report on",
	}
	for _, name := range []string{"no-pivot", "empty-ns", "lazy-pages", "page-server", "status-fd"} {
		if c.IsSet(name) && (!isBoolFlag(c.Command.Flags, name) || c.Bool(name)) {
			return fmt.Errorf("tclone %s: --%s is runc's and not supported: %s", c.Command.Name, name, why[name])
		}
	}
	return nil
}

// checkpointVerb is what checkpoint and restore check first: their one
// argument, runc's flags tclone cannot honour, and crun. It returns the
// argument and the engine that runs the verb on that crun.
func checkpointVerb(c *cli.Context, arg string) (string, *fork.Engine, error) {
	id, err := oneArg(c, arg)
	if err != nil {
		return "", nil, err
	}
	if err := refuseRunc(c); err != nil {
		return "", nil, err
	}
	rt, err := findCrun(c)
	if err != nil {
		return "", nil, err
	}
	return id, engineOf(c, rt), nil
}
