// Command podman-fork is `podman container fork`: it forks a running Podman
// container (run with --runtime tclone) into new sibling containers.
// Installed as podman-fork; the podman wrapper that hack/install.sh puts in
// /usr/local/bin turns `podman container fork ...` into this command.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/buildinfo"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
	"github.com/tclone/tclone/shim/forkflags/podmanflags"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

func main() {
	// ^C or a TERM cancels the fork: it rolls back whatever it made, and
	// a Podman service started for it is stopped, before the command exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	layout := plan.HostLayout()
	app := newApp(layout)
	if filepath.Base(os.Args[0]) == BranchCommand {
		app = newBranchApp(layout)
	}
	err := app.RunContext(ctx, os.Args)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(125)
	}
}

// agentOf is the host agent on that layout.
func agentOf(c *cli.Context) *hostagent.Agent { return hostagent.New(hostlayout.Of(c)) }

func newApp(layout plan.Layout) *cli.App {
	return &cli.App{
		Metadata:  hostlayout.Metadata(layout),
		Name:      "podman container fork",
		Usage:     "fork a running container into new sibling containers",
		UsageText: "podman container fork [options] SOURCE",
		Version:   buildinfo.Version,
		Description: `Captures SOURCE's whole process tree, memory, open files, sockets and
filesystem at one instant, and creates new containers from it that run on
independently, each with its own ID, name, IP and hostname. SOURCE is paused
briefly and keeps running. SOURCE must run with --runtime tclone.

Prints the new container IDs, one per line, like podman create.`,
		HideHelpCommand: true,
		// A hook or a label may hold commas: each flag is one value.
		DisableSliceFlagSeparator: true,
		Flags: append(podmanflags.PodmanFork(),
			&cli.BoolFlag{Name: "print-stats", Usage: "print the fork's timings as JSON instead of the IDs (waits for each sibling's memory, as --wait-memory)"},
			&cli.StringFlag{Name: "format", Usage: "output format: json prints the new containers as a JSON array"},
			&cli.StringFlag{Name: "url", EnvVars: []string{"CONTAINER_HOST"}, Usage: "API service to fork through: tclone's (unix:///run/tclone/tclone.sock, ssh://USER@HOST/run/tclone/tclone.sock) " +
				"forks wherever it runs; Podman's own forks here, as root on its host (default: the local Podman service, started for this call if none runs)"},
			&cli.StringFlag{Name: "connection", Aliases: []string{"c"}, EnvVars: []string{"CONTAINER_CONNECTION"}, Usage: "a connection from `podman system connection ls` to use as --url, with its ssh identity"},
			&cli.StringFlag{Name: "ssh-identity", EnvVars: []string{"CONTAINER_SSHKEY"}, Usage: "ssh key for an ssh:// --url (Podman's --identity; --identity here is the siblings')"},
			&cli.BoolFlag{Name: "private-service", Hidden: true, Usage: "start a Podman service for this call even when the system one answers"},
			&cli.BoolFlag{Name: "debug", Usage: "debug output"},
		),
		Action: run,
	}
}

// connectTo is connect; tests replace it to prove that a refused call never
// gets as far as Podman.
var connectTo = connect

func run(c *cli.Context) error {
	if c.Bool("debug") {
		logrus.SetLevel(logrus.DebugLevel)
	}
	if c.NArg() != 1 || c.Args().First() == "" {
		return fmt.Errorf("podman container fork takes exactly one SOURCE container; see --help")
	}
	if _, err := readFormat(c); err != nil {
		return err
	}
	opts, err := options(c)
	if err != nil {
		return err
	}
	// Every flag is checked before a service is started or anything
	// else happens.
	if err := hostagent.Validate(opts); err != nil {
		return err
	}
	target, err := destination(c.String("url"), c.String("connection"), c.String("ssh-identity"))
	if err != nil {
		return err
	}
	ctx, stop, err := connectTo(c.Context, hostlayout.Of(c), target, c.Bool("private-service"))
	if err != nil {
		return err
	}
	defer stop()
	stats, err := fork(ctx, agentOf(c), c.Args().First(), opts)
	if err != nil {
		return err
	}
	return report(c, stats)
}

// fork asks tclone's API service to fork, when the connection is to it;
// with Podman's own service, which the client refuses before asking
// anything, the fork runs here, through the host agent, which needs root
// on the Podman host.
func fork(ctx context.Context, agent *hostagent.Agent, source string, opts podmanfork.Options) (*podmanfork.Stats, error) {
	stats, err := podmanfork.ForkWithStats(ctx, source, opts)
	if errors.Is(err, podmanfork.ErrNotTcloneService) {
		return agent.ForkHere(ctx, source, opts)
	}
	return stats, err
}

// report prints what a call made in one write: the call is over, and a
// kill now must find the report either whole or not begun.
func report(c *cli.Context, stats *podmanfork.Stats) error {
	var buf bytes.Buffer
	out := json.NewEncoder(&buf)
	out.SetIndent("", "  ")
	var err error
	switch {
	case c.Bool("print-stats"):
		err = out.Encode(stats)
	case c.String("format") == "json":
		err = out.Encode(stats.Siblings)
	default:
		for _, r := range stats.Siblings {
			fmt.Fprintln(&buf, r.ID)
		}
	}
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(buf.Bytes())
	return err
}

// readFormat reads --format: "" or json.
func readFormat(c *cli.Context) (string, error) {
	if f := c.String("format"); f != "" && f != "json" {
		return "", fmt.Errorf("unknown --format %q (use json)", f)
	}
	return c.String("format"), nil
}

func options(c *cli.Context) (podmanfork.Options, error) {
	opts, err := podmanflags.ReadPodmanFork(c)
	// --print-stats reports when each sibling's memory was complete.
	opts.WaitMemory = opts.WaitMemory || c.Bool("print-stats")
	return opts, err
}
