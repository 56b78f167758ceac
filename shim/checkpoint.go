package main

import (
	"errors"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/fork"
)

var checkpointCommand = &cli.Command{
	Name:      "checkpoint",
	Usage:     "checkpoint a running container (a fork plan when a fork client asked for one)",
	ArgsUsage: "CONTAINER",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "image-path", Usage: "directory for CRIU's images"},
		&cli.StringFlag{Name: "work-path", Usage: "directory for CRIU's log and work files"},
		&cli.BoolFlag{Name: "leave-running", Usage: "keep the container running after the checkpoint"},
		&cli.BoolFlag{Name: "tcp-established", Usage: "allow open TCP connections"},
		&cli.BoolFlag{Name: "ext-unix-sk", Usage: "allow external unix sockets"},
		&cli.BoolFlag{Name: "shell-job", Usage: "allow shell jobs"},
		&cli.BoolFlag{Name: "file-locks", Usage: "allow file locks"},
		&cli.StringFlag{Name: "network-lock", Usage: "network lock method (crun)"},
		&cli.StringFlag{Name: "parent-path", Usage: "previous images for a pre-dump chain (crun)"},
		&cli.BoolFlag{Name: "pre-dump", Usage: "dump memory only and leave the container running (crun)"},
		&cli.StringFlag{Name: "manage-cgroups-mode", Usage: "cgroups mode: soft, ignore, full or strict"},
	},
	Action: func(c *cli.Context) error {
		id, err := oneArg(c, "CONTAINER")
		if err != nil {
			return err
		}
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		opts := checkpointOptions(c)
		if !opts.PreDump {
			// Podman's stop of the call (SIGTERM) or a ^C stops CRIU at
			// once: the source runs on and the capture is undone. A fork
			// capture checks CRIU itself, and leaves any failure where the
			// fork client reads it.
			ctx, stop := signalContext(c.Context)
			defer stop()
			captured, err := fork.NewEngine(rt).CheckpointForIntent(ctx, id, opts.ImagePath, opts.WorkPath, opts.LeaveRunning)
			if err != nil {
				return err
			}
			if captured != nil {
				return nil
			}
		}
		// Refuse before CRIU touches the container if CRIU cannot do the job.
		check, err := criucheck.Check(c.Context)
		if err != nil {
			return err
		}
		for _, kv := range check.Env() {
			k, v, _ := strings.Cut(kv, "=")
			os.Setenv(k, v)
		}
		return rt.Exec("checkpoint", append(opts.crunArgs(), id))
	},
}

// checkpointOpts are crun's checkpoint flags.
type checkpointOpts struct {
	ImagePath, WorkPath, NetworkLock, ParentPath, ManageCgroupsMode string
	LeaveRunning, TCPEstablished, ExtUnixSk, ShellJob, FileLocks    bool
	PreDump                                                         bool
}

func checkpointOptions(c *cli.Context) checkpointOpts {
	return checkpointOpts{
		ImagePath: c.String("image-path"), WorkPath: c.String("work-path"),
		NetworkLock: c.String("network-lock"), ParentPath: c.String("parent-path"),
		ManageCgroupsMode: c.String("manage-cgroups-mode"),
		LeaveRunning:      c.Bool("leave-running"), TCPEstablished: c.Bool("tcp-established"),
		ExtUnixSk: c.Bool("ext-unix-sk"), ShellJob: c.Bool("shell-job"), FileLocks: c.Bool("file-locks"),
		PreDump: c.Bool("pre-dump"),
	}
}

// crunArgs renders the options back in crun's spelling.
func (o checkpointOpts) crunArgs() []string {
	var a argList
	a.str("--image-path", o.ImagePath)
	a.str("--work-path", o.WorkPath)
	a.flag("--leave-running", o.LeaveRunning)
	a.flag("--tcp-established", o.TCPEstablished)
	a.flag("--ext-unix-sk", o.ExtUnixSk)
	a.flag("--shell-job", o.ShellJob)
	a.flag("--file-locks", o.FileLocks)
	a.str("--network-lock", o.NetworkLock)
	a.str("--parent-path", o.ParentPath)
	a.flag("--pre-dump", o.PreDump)
	a.str("--manage-cgroups-mode", o.ManageCgroupsMode)
	return a
}

// argList builds crun argument vectors.
type argList []string

func (a *argList) str(name, v string) {
	if v != "" {
		*a = append(*a, name, v)
	}
}

func (a *argList) flag(name string, v bool) {
	if v {
		*a = append(*a, name)
	}
}

func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", errors.New(c.Command.Name + " takes exactly one " + what + " argument; see 'tclone " + c.Command.Name + " --help'")
	}
	return c.Args().First(), nil
}
