package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/fork"
)

var restoreFlags = []cli.Flag{
	&cli.StringFlag{Name: "bundle", Aliases: []string{"b"}, Value: ".", Usage: "the new container's bundle"},
	&cli.StringFlag{Name: "image-path", Usage: "CRIU images, a fork plan, or a checkpoint directory referring to one"},
	&cli.StringFlag{Name: "work-path", Usage: "directory for CRIU's log and work files"},
	&cli.BoolFlag{Name: "tcp-established", Usage: "restore open TCP connections (a fork plan: only one captured with --tcp-established, into the source's network namespace)"},
	&cli.BoolFlag{Name: "tcp-close", Usage: "close the restored copies of open TCP connections (what a fork plan does by default)"},
	&cli.BoolFlag{Name: "ext-unix-sk", Usage: "allow external unix sockets"},
	&cli.BoolFlag{Name: "shell-job", Usage: "allow shell jobs"},
	&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "detach from the container's process"},
	&cli.StringFlag{Name: "pid-file", Usage: "where to write the new container's PID"},
	&cli.StringFlag{Name: "console-socket", Usage: "unix socket that receives the terminal's master"},
	&cli.BoolFlag{Name: "file-locks", Usage: "restore file locks"},
	&cli.StringFlag{Name: "manage-cgroups-mode", Usage: "cgroups mode: soft, ignore, full or strict"},
	&cli.StringFlag{Name: "network-lock", Usage: "network lock method (crun)"},
	&cli.StringFlag{Name: "lsm-profile", Usage: "LSM profile for the restored tree, TYPE:NAME"},
	&cli.StringFlag{Name: "lsm-mount-context", Usage: "LSM mount context for the restored tree"},
	&cli.BoolFlag{Name: "print-stats", Usage: "print fork timings as JSON (fork plans only)"},
}

var restoreCommand = &cli.Command{
	Name:      "restore",
	Usage:     "restore a container from a checkpoint, or materialise a sibling from a fork plan",
	ArgsUsage: "NEW-ID",
	Flags:     restoreFlags,
	Action: func(c *cli.Context) error {
		id, err := oneArg(c, "NEW-ID")
		if err != nil {
			return err
		}
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		opts := restoreOptions(c)
		eng := fork.NewEngine(rt)
		planDir, err := eng.PlanDirFor(opts.ImagePath)
		if err != nil {
			return err
		}
		if planDir != "" {
			req := opts.materializeRequest(id, planDir)
			m, err := eng.Materialize(c.Context, req)
			if err != nil {
				return err
			}
			if c.Bool("print-stats") {
				return printJSON(m)
			}
			return nil
		}
		check, err := criucheck.Check(c.Context)
		if err != nil {
			return err
		}
		env, cleanup, err := opts.criuEnv()
		if err != nil {
			return err
		}
		defer cleanup()
		return eng.RestoreCheckpoint(c.Context, id, opts.Bundle, opts.crunArgs(), append(check.Env(), env...))
	},
}

// criuEnv is the environment that gives CRIU the options crun's restore
// has no flag for: --tcp-close (crun 1.21 would refuse the flag).
func (o restoreOpts) criuEnv() (env []string, cleanup func(), err error) {
	if !o.TCPClose {
		return nil, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "tclone-restore-")
	if err != nil {
		return nil, nil, err
	}
	conf, err := fork.TCPCloseConfig(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return []string{conf}, func() { os.RemoveAll(dir) }, nil
}

// restoreOpts are crun's restore flags plus --tcp-close, which crun lacks.
type restoreOpts struct {
	Bundle, ImagePath, WorkPath, PidFile, ConsoleSocket     string
	ManageCgroupsMode, NetworkLock, LSMProfile, LSMMountCtx string
	TCPEstablished, TCPClose, ExtUnixSk, ShellJob           bool
	Detach, FileLocks                                       bool
}

func restoreOptions(c *cli.Context) restoreOpts {
	return restoreOpts{
		Bundle: c.String("bundle"), ImagePath: c.String("image-path"), WorkPath: c.String("work-path"),
		PidFile: c.String("pid-file"), ConsoleSocket: c.String("console-socket"),
		ManageCgroupsMode: c.String("manage-cgroups-mode"), NetworkLock: c.String("network-lock"),
		LSMProfile: c.String("lsm-profile"), LSMMountCtx: c.String("lsm-mount-context"),
		TCPEstablished: c.Bool("tcp-established"), TCPClose: c.Bool("tcp-close"),
		ExtUnixSk: c.Bool("ext-unix-sk"), ShellJob: c.Bool("shell-job"),
		Detach: c.Bool("detach"), FileLocks: c.Bool("file-locks"),
	}
}

// crunArgs renders the options for an ordinary checkpoint restore by crun.
func (o restoreOpts) crunArgs() []string {
	var a argList
	a.str("--bundle", o.Bundle)
	a.str("--image-path", o.ImagePath)
	a.str("--work-path", o.WorkPath)
	a.flag("--tcp-established", o.TCPEstablished)
	a.flag("--ext-unix-sk", o.ExtUnixSk)
	a.flag("--shell-job", o.ShellJob)
	a.flag("--detach", o.Detach)
	a.str("--pid-file", o.PidFile)
	a.str("--console-socket", o.ConsoleSocket)
	a.flag("--file-locks", o.FileLocks)
	a.str("--manage-cgroups-mode", o.ManageCgroupsMode)
	a.str("--network-lock", o.NetworkLock)
	a.str("--lsm-profile", o.LSMProfile)
	a.str("--lsm-mount-context", o.LSMMountCtx)
	return a
}

// materializeRequest maps the restore flags onto a sibling request.
func (o restoreOpts) materializeRequest(id, planDir string) fork.MaterializeRequest {
	return fork.MaterializeRequest{
		Plan: planDir, ID: id, Bundle: o.Bundle,
		Detach: o.Detach, PidFile: o.PidFile, ConsoleSocket: o.ConsoleSocket, WorkPath: o.WorkPath,
		TCPClose: o.TCPClose, TCPKeep: o.TCPEstablished, ManageCgroupsMode: o.ManageCgroupsMode,
		LSMProfile: o.LSMProfile, LSMMountContext: o.LSMMountCtx,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	}
}
