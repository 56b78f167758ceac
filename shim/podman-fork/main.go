// Command podman-fork is `podman container fork`: it forks a running Podman
// container (run with --runtime tclone) into new sibling containers.
// Installed as podman-fork; the podman wrapper that hack/install.sh puts in
// /usr/local/bin turns `podman container fork ...` into this command.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/buildinfo"
	"github.com/tclone/tclone/shim/forkflags"
	"github.com/tclone/tclone/shim/podmanfork"
)

func main() {
	// ^C or a TERM cancels the fork: it rolls back whatever it made, and
	// a Podman service started for it is stopped, before the command exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := newApp().RunContext(ctx, os.Args)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(125)
	}
}

func newApp() *cli.App {
	return &cli.App{
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
		Flags: slices.Concat(forkflags.Capture(), forkflags.Sibling(), []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "name of the new container (with --count N: NAME-1..NAME-N); default SOURCE-fork-<n>"},
			&cli.IntFlag{Name: "count", Value: 1, Usage: fmt.Sprintf("number of siblings, 1..%d, all or nothing", podmanfork.MaxCount)},
			&cli.IntFlag{Name: "parallel", Usage: fmt.Sprintf("restore this many siblings at once, 1..%d (default: one per CPU, up to 4)", podmanfork.MaxCount)},
			&cli.StringSliceFlag{Name: "publish", Aliases: []string{"p"}, Usage: "publish a port of each sibling (podman -p syntax)"},
			&cli.BoolFlag{Name: "ignore-static-ip", Usage: "give siblings of a source with a static IP fresh addresses"},
			&cli.BoolFlag{Name: "ignore-static-mac", Usage: "give siblings of a source with a static MAC fresh addresses"},
			&cli.StringSliceFlag{Name: "label", Aliases: []string{"l"}, Usage: "add a label KEY=VALUE to each sibling"},
			&cli.StringSliceFlag{Name: "volume-mode", Usage: "what siblings get of the source's named volumes: copy (default: a new volume each, <volume>-<sibling>, " +
				"as it was at the fork instant, removed by podman rm -v), share (the source's own), or NAME=copy|share for one volume; host directories are always shared"},
			&cli.StringSliceFlag{Name: "hook", Usage: "command run with sh -c in each sibling before it is reported; a failure fails the fork"},
			&cli.StringFlag{Name: "ready", Value: "running", Usage: "when a sibling is up: running (Podman and crun say it runs; needs nothing in the image), " +
				"exec (`true` runs in it), tcp:PORT (it accepts a connection) or http:PORT/PATH (GET answers 2xx/3xx)"},
			&cli.DurationFlag{Name: "ready-timeout", Value: podmanfork.DefaultReadyTimeout, Usage: "how long hooks plus readiness may take per sibling (> 0)"},
			&cli.BoolFlag{Name: "print-stats", Usage: "print the fork's timings as JSON instead of the IDs"},
			&cli.StringFlag{Name: "format", Usage: "output format: json prints the new containers as a JSON array"},
			&cli.StringFlag{Name: "url", EnvVars: []string{"CONTAINER_HOST"}, Usage: "Podman service URL (default: the local service, started for this call if none runs)"},
			&cli.BoolFlag{Name: "private-service", Hidden: true, Usage: "start a Podman service for this call even when the system one answers"},
			&cli.BoolFlag{Name: "debug", Usage: "debug output"},
		}),
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
	format := c.String("format")
	if format != "" && format != "json" {
		return fmt.Errorf("unknown --format %q (use json)", format)
	}
	opts, err := options(c)
	if err != nil {
		return err
	}
	// Every flag is checked before a service is started or anything
	// else happens.
	if err := opts.Validate(); err != nil {
		return err
	}
	ctx, stop, err := connectTo(c.Context, c.String("url"), c.Bool("private-service"))
	if err != nil {
		return err
	}
	defer stop()
	stats, err := podmanfork.ForkWithStats(ctx, c.Args().First(), opts)
	if err != nil {
		return err
	}
	// One write: the call is over, and a kill now must find the report
	// either whole or not begun.
	var buf bytes.Buffer
	out := json.NewEncoder(&buf)
	out.SetIndent("", "  ")
	switch {
	case c.Bool("print-stats"):
		err = out.Encode(stats)
	case format == "json":
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

func options(c *cli.Context) (podmanfork.Options, error) {
	labels, err := podmanfork.ParseLabels(c.StringSlice("label"))
	if err != nil {
		return podmanfork.Options{}, err
	}
	ready, err := podmanfork.ParseReady(c.String("ready"))
	if err != nil {
		return podmanfork.Options{}, err
	}
	count := c.Int("count")
	if count < 1 || count > podmanfork.MaxCount {
		return podmanfork.Options{}, fmt.Errorf("--count %d out of range: fork 1 to %d siblings at a time", count, podmanfork.MaxCount)
	}
	// 0 is the default (one per CPU, up to 4), but only when not given.
	if p := c.Int("parallel"); c.IsSet("parallel") && (p < 1 || p > podmanfork.MaxCount) {
		return podmanfork.Options{}, fmt.Errorf("--parallel %d out of range: restore 1 to %d siblings at a time", p, podmanfork.MaxCount)
	}
	if d := c.Duration("ready-timeout"); d <= 0 {
		return podmanfork.Options{}, fmt.Errorf("--ready-timeout %s: give a duration above zero, such as 30s", d)
	}
	fork, err := forkflags.Read(c)
	if err != nil {
		return podmanfork.Options{}, err
	}
	volumeModes, err := podmanfork.ParseVolumeModes(c.StringSlice("volume-mode"))
	if err != nil {
		return podmanfork.Options{}, fmt.Errorf("--volume-mode: %w", err)
	}
	opts := podmanfork.Options{
		Count:           count,
		Publish:         c.StringSlice("publish"),
		IgnoreStaticIP:  c.Bool("ignore-static-ip"),
		IgnoreStaticMAC: c.Bool("ignore-static-mac"),
		Fork:            fork,
		Labels:          labels,
		Hooks:           c.StringSlice("hook"),
		Ready:           ready,
		ReadyTimeout:    c.Duration("ready-timeout"),
		Parallel:        c.Int("parallel"),
		VolumeModes:     volumeModes,
		// --print-stats reports when each sibling's memory was complete.
		WaitMemory: c.Bool("print-stats"),
	}
	if c.IsSet("name") {
		name := c.String("name")
		if err := podmanfork.CheckName(name); err != nil {
			return podmanfork.Options{}, fmt.Errorf("--name: %w", err)
		}
		if opts.Count <= 1 {
			opts.Names = []string{name}
		} else {
			for i := 1; i <= opts.Count; i++ {
				opts.Names = append(opts.Names, fmt.Sprintf("%s-%d", name, i))
			}
		}
	}
	return opts, nil
}
