package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/plan"
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
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "bundle", Aliases: []string{"b"}, Value: ".", Usage: "the sibling's bundle"},
		&cli.BoolFlag{Name: "plan-only", Usage: "capture only; print the plan's location"},
		&cli.IntFlag{Name: "uses", Value: plan.Unlimited, Usage: "with --plan-only: how many siblings the plan serves (-1: any number until it expires)"},
		&cli.DurationFlag{Name: "ttl", Value: fork.DefaultPlanTTL, Usage: "with --plan-only: how long an unused plan is kept"},
		&cli.StringFlag{Name: "identity", Value: string(plan.IdentityUnique), Usage: "unique (own hostname and machine-id), best-effort or preserve"},
		// The sibling always runs in the background; the flag is accepted
		// because crun's restore spells it so.
		&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Value: true, Hidden: true},
		&cli.StringFlag{Name: "pid-file", Usage: "where to write the sibling's PID"},
		&cli.StringFlag{Name: "console-socket", Usage: "unix socket that receives the sibling's terminal master"},
		&cli.BoolFlag{Name: "tcp-established", Usage: "let the sibling keep the source's open TCP connections (only a sibling whose config.json joins the source's network namespace)"},
		&cli.BoolFlag{Name: "tcp-close", Usage: "close the sibling's copies of the source's open TCP connections; the source keeps them (the default)"},
		&cli.BoolFlag{Name: "file-locks", Usage: "capture and restore file locks"},
		&cli.BoolFlag{Name: "ext-unix-sk", Usage: "allow unix sockets connected outside the container"},
		&cli.BoolFlag{Name: "shell-job", Usage: "allow a tree attached to an outside terminal session"},
		&cli.BoolFlag{Name: "print-stats", Usage: "print per-phase timings and the source pause as JSON"},
		&cli.DurationFlag{Name: "capture-timeout", Value: fork.DefaultCaptureTimeout, Usage: "longest the source may be held for the capture; then CRIU is stopped, the source runs on and the fork fails"},
	},
	Action: func(c *cli.Context) error {
		// ^C or a monitor's SIGTERM stops CRIU at once, which releases the
		// source, and undoes what the fork made so far.
		ctx, stop := signalContext(c.Context)
		defer stop()
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		identity, err := plan.ParseIdentity(c.String("identity"))
		if err != nil {
			return err
		}
		capture := fork.CaptureOptions{
			FileLocks: c.Bool("file-locks"),
			ExtUnixSk: c.Bool("ext-unix-sk"),
			ShellJob:  c.Bool("shell-job"),
		}
		tcp, err := plan.TCPPolicyFromFlags(c.Bool("tcp-established"), c.Bool("tcp-close"))
		if err != nil {
			return err
		}
		if !c.Bool("plan-only") && (c.IsSet("uses") || c.IsSet("ttl")) {
			return fmt.Errorf("--uses and --ttl apply to --plan-only: a plain fork's plan serves its one sibling")
		}
		if uses := c.Int("uses"); uses == 0 || uses < plan.Unlimited {
			return fmt.Errorf("--uses %d: give a number of siblings (1 or more), or -1 for any number until the plan expires", uses)
		}
		if c.Duration("capture-timeout") <= 0 {
			return fmt.Errorf("--capture-timeout %s: give a positive duration, such as 60s", c.Duration("capture-timeout"))
		}
		eng := fork.NewEngine(rt)
		eng.CaptureTimeout = c.Duration("capture-timeout")
		if c.Bool("plan-only") {
			if c.NArg() != 1 {
				return fmt.Errorf("fork --plan-only takes exactly one argument, SOURCE")
			}
			captured, err := eng.Capture(ctx, fork.CaptureRequest{
				Source: c.Args().First(), Options: capture, Uses: c.Int("uses"), TTL: c.Duration("ttl"), Identity: identity,
				TCP: tcp,
			})
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
			Source: c.Args().Get(0), Capture: capture, Identity: identity, TCP: tcp,
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
			return printJSON(report)
		}
		return nil
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
