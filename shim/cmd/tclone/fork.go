package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/flagtable"
	"github.com/tclone/tclone/shim/forkflags"
)

var forkCommand = &cli.Command{
	Name:  "fork",
	Usage: "fork a running container into a sibling container",
	Description: `Captures SOURCE's whole process tree, memory, open files, sockets and root
filesystem at one instant and builds NEW-ID from it, using NEW-ID's own bundle
(--bundle) for everything that makes it a different container: root path,
hostname, cgroup, network namespace, mounts. SOURCE is paused only for the
capture and keeps running.

With --plan-only, only the capture is made; its directory is printed and
'tclone restore --image-path PLAN --bundle DIR NEW-ID' builds siblings from it.`,
	ArgsUsage: "SOURCE [NEW-ID]",
	Flags: slices.Concat([]cli.Flag{
		&cli.StringFlag{Name: "bundle", Aliases: []string{"b"}, Value: ".", Usage: "the sibling's bundle"},
		&cli.BoolFlag{Name: "plan-only", Usage: "capture only; print the plan's location (--uses and --ttl apply to it)"},
		// The sibling always runs in the background; the flag is accepted
		// because crun's restore spells it so.
		&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Value: true, Hidden: true},
		&cli.StringFlag{Name: "pid-file", Usage: "where to write the sibling's PID"},
		&cli.StringFlag{Name: "console-socket", Usage: "unix socket that receives the sibling's terminal master"},
		&cli.BoolFlag{Name: "print-stats", Usage: "print per-phase timings and the source pause as JSON"},
	}, forkflags.Capture(), forkflags.Sibling(), forkflags.PlanLife(), []cli.Flag{forkflags.Timeout()}),
	Action: func(c *cli.Context) error {
		// ^C or a monitor's SIGTERM stops CRIU at once, which releases the
		// source, and undoes what the fork made so far.
		ctx, stop := signalContext(c.Context)
		defer stop()
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		opts, err := forkflags.Read(c)
		if err != nil {
			return err
		}
		if !c.Bool("plan-only") && len(flagtable.Given(c, opts, flagtable.InGroups(forkopts.GroupPlan))) > 0 {
			return fmt.Errorf("--uses and --ttl apply to --plan-only: a plain fork's plan serves its one sibling")
		}
		eng := engineOf(c, rt)
		if c.Bool("plan-only") {
			if c.NArg() != 1 {
				return fmt.Errorf("fork --plan-only takes exactly one argument, SOURCE")
			}
			captured, err := eng.Capture(ctx, fork.CaptureRequest{Source: c.Args().First(), Fork: opts})
			if err != nil {
				return err
			}
			if c.Bool("print-stats") {
				return printJSON(struct {
					Dir  string     `json:"plan_dir"`
					Plan *plan.Plan `json:"plan"`
				}{captured.Dir, captured.Plan})
			}
			fmt.Println(captured.Dir)
			return nil
		}
		if c.NArg() != 2 {
			return fmt.Errorf("fork takes SOURCE and NEW-ID (or --plan-only SOURCE); see 'tclone fork --help'")
		}
		report, err := eng.Fork(ctx, fork.ForkRequest{
			Source: c.Args().Get(0), Fork: opts,
			Sibling: fork.MaterializeRequest{
				ID: c.Args().Get(1), Bundle: c.String("bundle"), Detach: true,
				PidFile: c.String("pid-file"), ConsoleSocket: c.String("console-socket"),
				Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
			},
		})
		if err != nil {
			return err
		}
		if c.Bool("print-stats") {
			// The sibling runs already; its stats say when its memory
			// was complete too. Should the wait fail, the sibling stays:
			// it runs, and is reported.
			if err := eng.WaitForkMemory(ctx, report); err != nil {
				logrus.Warn(err)
			}
			if err := printJSON(report); err != nil {
				return err
			}
		}
		return report.Reported()
	},
}

// signalContext is cancelled by SIGINT or SIGTERM, so that a fork or a fork
// checkpoint that is interrupted stops CRIU and cleans up before it exits.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
