package main

import (
	"os"
	"slices"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/forkflags"
)

// restoreFlags are crun's restore flags, with the fork's capture flags in
// their restore meaning: for a fork plan, --tcp-established and --tcp-close
// choose the sibling's TCP policy (the plan decides the rest); for an
// ordinary checkpoint they go to crun and CRIU.
var restoreFlags = slices.Concat([]cli.Flag{
	&cli.StringFlag{Name: "bundle", Aliases: []string{"b"}, Value: ".", Usage: "the new container's bundle"},
	&cli.StringFlag{Name: "image-path", Usage: "CRIU images, a fork plan, or a checkpoint directory referring to one"},
	&cli.StringFlag{Name: "work-path", Usage: "directory for CRIU's log and work files"},
	&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "detach from the container's process"},
	&cli.StringFlag{Name: "pid-file", Usage: "where to write the new container's PID"},
	&cli.StringFlag{Name: "console-socket", Usage: "unix socket that receives the terminal's master"},
	&cli.StringFlag{Name: "manage-cgroups-mode", Usage: "cgroups mode: soft, ignore, full or strict"},
	&cli.StringFlag{Name: "network-lock", Usage: "network lock method (crun)"},
	&cli.StringFlag{Name: "lsm-profile", Usage: "LSM profile for the restored tree, TYPE:NAME"},
	&cli.StringFlag{Name: "lsm-mount-context", Usage: "LSM mount context for the restored tree"},
	&cli.BoolFlag{Name: "print-stats", Usage: "print fork timings as JSON (fork plans only)"},
}, forkflags.RestoreCapture(), []cli.Flag{forkflags.MemoryFlag()}, runcRestoreFlags)

var restoreCommand = &cli.Command{
	Name:      "restore",
	Usage:     "restore a container from a checkpoint, or materialise a sibling from a fork plan",
	ArgsUsage: "NEW-ID",
	Flags:     restoreFlags,
	Action: func(c *cli.Context) error {
		id, eng, err := checkpointVerb(c, "NEW-ID")
		if err != nil {
			return err
		}
		// The capture flags, and --memory for a sibling of a plan.
		opts, err := forkflags.Read(c)
		if err != nil {
			return err
		}
		capture := opts.Capture
		planDir, err := eng.PlanDirFor(c.String("image-path"))
		if err != nil {
			return err
		}
		if planDir != "" {
			m, err := eng.Materialize(c.Context, siblingRequest(c, id, planDir, opts))
			if err != nil {
				return err
			}
			if c.Bool("print-stats") {
				if err := eng.WaitMemory(c.Context, m); err != nil {
					logrus.Warn(err)
				}
				if err := printJSON(m); err != nil {
					return err
				}
			}
			return m.Reported()
		}
		check, err := eng.CheckCriu(c.Context)
		if err != nil {
			return err
		}
		env, cleanup, err := tcpCloseEnv(capture)
		if err != nil {
			return err
		}
		defer cleanup()
		return eng.Crun.RestoreCheckpoint(c.Context, id, c.String("bundle"), crunRestoreArgs(c, capture), append(check.Env(), env...))
	},
}

// crunRestoreArgs renders an ordinary restore's flags for crun.
func crunRestoreArgs(c *cli.Context, capture forkopts.Capture) []string {
	a := passThrough(c, "bundle", "image-path", "work-path", "detach", "pid-file", "console-socket")
	a = append(a, crunCapture(capture).Args()...)
	return append(a, passThrough(c, "manage-cgroups-mode", "network-lock", "lsm-profile", "lsm-mount-context")...)
}

// siblingRequest maps the restore flags, read into opts, onto a sibling of
// a fork plan: the TCP flags choose its policy, --memory how it gets its
// memory, and the plan decides the other capture options.
func siblingRequest(c *cli.Context, id, planDir string, opts forkopts.Fork) fork.MaterializeRequest {
	return fork.MaterializeRequest{
		Plan: planDir, ID: id, Bundle: c.String("bundle"),
		Detach: c.Bool("detach"), PidFile: c.String("pid-file"), ConsoleSocket: c.String("console-socket"),
		WorkPath: c.String("work-path"), TCP: opts.TCP, Memory: opts.Memory,
		ManageCgroupsMode: c.String("manage-cgroups-mode"),
		LSMProfile:        c.String("lsm-profile"), LSMMountContext: c.String("lsm-mount-context"),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	}
}

// tcpCloseEnv is the environment that gives CRIU --tcp-close for an
// ordinary restore: crun has no flag for it, so CRIU reads it from a
// configuration file, which cleanup removes.
func tcpCloseEnv(capture forkopts.Capture) (env []string, cleanup func(), err error) {
	if capture.TCP != forkopts.TCPClose {
		return nil, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "tclone-restore-")
	if err != nil {
		return nil, nil, err
	}
	conf, err := crun.CRIUConfig(dir, crun.CRIUTCPClose)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return []string{conf}, func() { os.RemoveAll(dir) }, nil
}
