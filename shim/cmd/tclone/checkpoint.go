package main

import (
	"errors"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/forkflags"
)

var checkpointCommand = &cli.Command{
	Name:      "checkpoint",
	Usage:     "checkpoint a running container (a fork plan when a fork client asked for one)",
	ArgsUsage: "CONTAINER",
	Flags: slices.Concat([]cli.Flag{
		&cli.StringFlag{Name: "image-path", Usage: "directory for CRIU's images"},
		&cli.StringFlag{Name: "work-path", Usage: "directory for CRIU's log and work files"},
		&cli.BoolFlag{Name: "leave-running", Usage: "keep the container running after the checkpoint"},
		&cli.StringFlag{Name: "network-lock", Usage: "network lock method (crun)"},
		&cli.StringFlag{Name: "parent-path", Usage: "previous images for a pre-dump chain (crun)"},
		&cli.BoolFlag{Name: "pre-dump", Usage: "dump memory only and leave the container running (crun)"},
		&cli.StringFlag{Name: "manage-cgroups-mode", Usage: "cgroups mode: soft, ignore, full or strict"},
	}, forkflags.CrunCapture(), runcCheckpointFlags),
	Action: func(c *cli.Context) error {
		id, eng, err := checkpointVerb(c, "CONTAINER")
		if err != nil {
			return err
		}
		if !c.Bool("pre-dump") {
			// Podman's stop of the call (SIGTERM) or a ^C stops CRIU at
			// once: the source runs on and the capture is undone. A fork
			// capture checks CRIU itself, and leaves any failure where the
			// fork client reads it.
			ctx, stop := signalContext(c.Context)
			defer stop()
			captured, err := eng.CheckpointForIntent(ctx, id, c.String("image-path"), c.String("work-path"), c.Bool("leave-running"))
			if err != nil {
				return err
			}
			if captured != nil {
				return nil
			}
		}
		// Refuse before CRIU touches the container if CRIU cannot do the job.
		check, err := eng.CheckCriu(c.Context)
		if err != nil {
			return err
		}
		capture, err := forkflags.ReadCapture(c)
		if err != nil {
			return err
		}
		if err := eng.WaitTwinsGone(c.Context, id); err != nil {
			return err
		}
		// An earlier fork of the container left its plan's reference in
		// Podman's checkpoint directory, which these images now fill: left
		// there, it would make them a fork plan's to a restore.
		if dir := c.String("image-path"); dir != "" {
			if err := plan.RemoveReference(dir); err != nil {
				return err
			}
		}
		// crun's CRIU inherits the environment CRIU needs here.
		return eng.Crun.Exec("checkpoint", append(crunCheckpointArgs(c, capture), id), check.Env())
	},
}

// crunCheckpointArgs renders an ordinary checkpoint's flags for crun.
func crunCheckpointArgs(c *cli.Context, capture forkopts.Capture) []string {
	a := passThrough(c, "image-path", "work-path", "leave-running")
	a = append(a, crunCapture(capture).Args()...)
	return append(a, passThrough(c, "network-lock", "parent-path", "pre-dump", "manage-cgroups-mode")...)
}

// crunCapture is the capture options as crun's own: a close policy has no
// crun flag (see crun.CRIUConfig).
func crunCapture(c forkopts.Capture) crun.Capture {
	return crun.Capture{TCPEstablished: c.TCP == forkopts.TCPKeep, FileLocks: c.FileLocks, ExtUnixSk: c.ExtUnixSk, ShellJob: c.ShellJob}
}

// passThrough renders the named flags of the command as given, in crun's
// spelling (tclone's flags for crun's verbs are crun's own).
func passThrough(c *cli.Context, names ...string) crun.Args {
	var a crun.Args
	for _, name := range names {
		if isBoolFlag(c.Command.Flags, name) {
			a.Flag("--"+name, c.Bool(name))
		} else {
			a.Value("--"+name, c.String(name))
		}
	}
	return a
}

func isBoolFlag(flags []cli.Flag, name string) bool {
	for _, f := range flags {
		if b, ok := f.(*cli.BoolFlag); ok && b.Name == name {
			return true
		}
	}
	return false
}

func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", errors.New(c.Command.Name + " takes exactly one " + what + " argument; see 'tclone " + c.Command.Name + " --help'")
	}
	return c.Args().First(), nil
}
