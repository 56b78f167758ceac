// Command tclone is an OCI runtime that forks running containers. Every
// ordinary verb is delegated to crun unchanged; `fork` is new, and
// `checkpoint`/`restore` understand fork plans.
package main

import (
	"fmt"
	"os"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/buildinfo"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/wptrack"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
)

const usage = `an OCI runtime that forks running containers

tclone is a drop-in replacement for crun. It hands every ordinary verb to
crun unchanged and adds "fork": a running container's whole process tree,
memory, open files and filesystem are captured at one instant and rebuilt in
a sibling container, while the source keeps running.

With Podman:
  podman run --runtime tclone ...        # run a container that can be forked
  podman container fork SOURCE           # fork it into a new container`

func main() {
	fork.RunRestoreWatchIfAsked()
	fork.RunKSMSettleIfAsked()
	lazy.RunDaemonIfAsked()
	wptrack.RunHolderIfAsked()
	lazy.RunShareHookIfAsked()
	if err := newApp(plan.HostLayout()).Run(os.Args); err != nil {
		fatal(err)
	}
}

// engineOf is the fork engine of this call: its crun, the host's layout.
func engineOf(c *cli.Context, rt *crun.Runtime) *fork.Engine {
	return fork.NewEngine(rt, hostlayout.Of(c))
}

func newApp(layout plan.Layout) *cli.App {
	app := &cli.App{
		Metadata:               hostlayout.Metadata(layout),
		Name:                   "tclone",
		Usage:                  usage,
		Version:                buildinfo.Version,
		UseShortOptionHandling: false,
		// crun prints its usage and exits 1 for unknown verbs; so do we,
		// through the fatal path, so Podman sees a proper error.
		CommandNotFound: func(c *cli.Context, verb string) {
			fatal(fmt.Errorf("unknown command %q; see 'tclone --help'", verb))
		},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "root", Usage: "crun state directory (default " + crun.DefaultRoot + ")"},
			&cli.StringFlag{Name: "log", Usage: "log destination, as crun: a file path or [file:]PATH (default stderr)"},
			&cli.StringFlag{Name: "log-format", Value: "", Usage: "log format: text or json"},
			&cli.StringFlag{Name: "log-level", Usage: "crun log level: error, warning or debug"},
			&cli.BoolFlag{Name: "debug", Usage: "verbose output"},
			&cli.BoolFlag{Name: "systemd-cgroup", Usage: "use systemd to manage cgroups"},
			&cli.StringFlag{Name: "cgroup-manager", Usage: "cgroup manager: cgroupfs, systemd or disabled"},
			&cli.StringFlag{Name: "rootless", Usage: "rootless mode: true, false or auto"},
		},
		Before: func(c *cli.Context) error {
			return configureLogging(c)
		},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	cli.VersionPrinter = printVersion
	app.Commands = append(delegatedCommands(), checkpointCommand, restoreCommand, forkCommand, gcCommand, statsCommand, serviceCommand, kubeCommand)
	return app
}

// globalOptions turns the global flags into crun's.
func globalOptions(c *cli.Context) crun.Global {
	return crun.Global{
		Root:          c.String("root"),
		Log:           c.String("log"),
		LogFormat:     c.String("log-format"),
		LogLevel:      c.String("log-level"),
		Debug:         c.Bool("debug"),
		SystemdCgroup: c.Bool("systemd-cgroup"),
		CgroupManager: c.String("cgroup-manager"),
		Rootless:      c.String("rootless"),
	}
}

// findCrun locates crun with the global flags of this call.
func findCrun(c *cli.Context) (*crun.Runtime, error) {
	return crun.Find(globalOptions(c))
}

func printVersion(c *cli.Context) {
	fmt.Printf("tclone version %s\n", c.App.Version)
	rt, err := crun.Find(crun.Global{})
	if err != nil {
		fmt.Printf("crun: %v\n", err)
		return
	}
	v, err := rt.Version(c.Context)
	if err != nil {
		fmt.Printf("crun: %v\n", err)
		return
	}
	fmt.Print(v)
}

func init() {
	// Until --log is parsed, errors go to stderr as text.
	logrus.SetOutput(os.Stderr)
}
