// Package podmanflags is the table of the flags of `podman container fork`
// and `podman container branch` beyond the fork flags of forkflags, and
// their readers, from a command line or from the query of a request to
// tclone's API service.
package podmanflags

import (
	"fmt"
	"io"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/shim/forkflags"

	"github.com/tclone/tclone/shim/podmanfork"
)

// Names of the flags of a Podman fork.
const (
	Name            = "name"
	Count           = "count"
	Parallel        = "parallel"
	Publish         = "publish"
	IgnoreStaticIP  = "ignore-static-ip"
	IgnoreStaticMAC = "ignore-static-mac"
	Label           = "label"
	VolumeMode      = "volume-mode"
	Hook            = "hook"
	Ready           = "ready"
	ReadyTimeout    = "ready-timeout"
	WaitMemory      = "wait-memory"
)

// PodmanFork is every flag that says what a `podman container fork` makes:
// the command's, and the query parameters of the fork endpoint of tclone's
// API service (see FromQuery). How the command prints its result and where
// it connects are the command's own.
func PodmanFork() []cli.Flag {
	return slices.Concat(forkflags.Capture(), forkflags.Sibling(), []cli.Flag{
		forkflags.Timeout(),
		&cli.StringSliceFlag{Name: Name, Usage: "name of the new container (with --count N: NAME-1..NAME-N, or give N names); default SOURCE-fork-<n>"},
		&cli.IntFlag{Name: Count, Value: 1, Usage: fmt.Sprintf("number of siblings, 1..%d, all or nothing", podmanfork.MaxCount)},
		&cli.IntFlag{Name: Parallel, Usage: fmt.Sprintf("restore this many siblings at once, 1..%d (default: one per CPU, up to 4)", podmanfork.MaxCount)},
		&cli.StringSliceFlag{Name: Publish, Aliases: []string{"p"}, Usage: "publish a port of each sibling (podman -p syntax)"},
		&cli.BoolFlag{Name: IgnoreStaticIP, Usage: "give siblings of a source with a static IP fresh addresses"},
		&cli.BoolFlag{Name: IgnoreStaticMAC, Usage: "give siblings of a source with a static MAC fresh addresses"},
		&cli.StringSliceFlag{Name: Label, Aliases: []string{"l"}, Usage: "add a label KEY=VALUE to each sibling"},
		&cli.StringSliceFlag{Name: VolumeMode, Usage: "what siblings get of the source's named volumes: copy (default: a new volume each, <volume>-<sibling>, " +
			"as it was at the fork instant, removed by podman rm -v), share (the source's own), or NAME=copy|share for one volume; host directories are always shared"},
		&cli.StringSliceFlag{Name: Hook, Usage: "command run with sh -c in each sibling before it is reported; a failure fails the fork"},
		&cli.StringFlag{Name: Ready, Value: "running", Usage: "when a sibling is up: running (Podman and crun say it runs; needs nothing in the image), " +
			"exec (`true` runs in it), tcp:PORT (it accepts a connection) or http:PORT/PATH (GET answers 2xx/3xx)"},
		&cli.DurationFlag{Name: ReadyTimeout, Value: podmanfork.DefaultReadyTimeout, Usage: "how long hooks plus readiness may take per sibling (> 0)"},
		&cli.BoolFlag{Name: WaitMemory, Usage: "report each sibling once it has all of its memory (memory_complete_ms); a lazily started sibling runs before"},
	})
}

// ReadPodmanFork reads the flags of PodmanFork into fork options, refusing
// what a flag alone can get wrong; Options.Validate checks the rest.
func ReadPodmanFork(c *cli.Context) (podmanfork.Options, error) {
	labels, err := podmanfork.ParseLabels(c.StringSlice(Label))
	if err != nil {
		return podmanfork.Options{}, err
	}
	ready, err := podmanfork.ParseReady(c.String(Ready))
	if err != nil {
		return podmanfork.Options{}, err
	}
	count := c.Int(Count)
	if count < 1 || count > podmanfork.MaxCount {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: Count, Value: fmt.Sprint(count), Advice: fmt.Sprintf("out of range: fork 1 to %d siblings at a time", podmanfork.MaxCount)}
	}
	// 0 is the default (one per CPU, up to 4), but only when not given.
	if p := c.Int(Parallel); c.IsSet(Parallel) && (p < 1 || p > podmanfork.MaxCount) {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: Parallel, Value: fmt.Sprint(p), Advice: fmt.Sprintf("out of range: restore 1 to %d siblings at a time", podmanfork.MaxCount)}
	}
	if d := c.Duration(ReadyTimeout); d <= 0 {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: ReadyTimeout, Value: d.String(), Advice: "give a duration above zero, such as 30s"}
	}
	fork, err := forkflags.Read(c)
	if err != nil {
		return podmanfork.Options{}, err
	}
	volumeModes, err := podmanfork.ParseVolumeModes(c.StringSlice(VolumeMode))
	if err != nil {
		return podmanfork.Options{}, fmt.Errorf("--%s: %w", VolumeMode, err)
	}
	opts := podmanfork.Options{
		Count:           count,
		Publish:         c.StringSlice(Publish),
		IgnoreStaticIP:  c.Bool(IgnoreStaticIP),
		IgnoreStaticMAC: c.Bool(IgnoreStaticMAC),
		Fork:            fork,
		Labels:          labels,
		Hooks:           c.StringSlice(Hook),
		Ready:           ready,
		ReadyTimeout:    c.Duration(ReadyTimeout),
		Parallel:        c.Int(Parallel),
		VolumeModes:     volumeModes,
		WaitMemory:      c.Bool(WaitMemory),
	}
	opts.Names, err = siblingNames(c.StringSlice(Name), count)
	return opts, err
}

// siblingNames reads --name: one name (NAME, or NAME-1..NAME-N for N
// siblings) or one per sibling.
func siblingNames(given []string, count int) ([]string, error) {
	for _, name := range given {
		if err := podmanfork.CheckName(name); err != nil {
			return nil, fmt.Errorf("--%s: %w", Name, err)
		}
	}
	switch {
	case len(given) == 1 && count > 1:
		names := make([]string, count)
		for i := range names {
			names[i] = fmt.Sprintf("%s-%d", given[0], i+1)
		}
		return names, nil
	case len(given) > 1 && len(given) != count:
		return nil, &forkflags.BadValue{Flag: Name, Value: strings.Join(given, ","), Advice: fmt.Sprintf("%d names for %d siblings: give one name (NAME-1..NAME-N), or one per sibling", len(given), count)}
	}
	return given, nil
}

// FromQuery reads the fork endpoint's query parameters: the flags of
// PodmanFork, each named as the flag (ready-timeout) or in the API's camel
// case (readyTimeout), repeated for a list. Every value is checked as the
// command checks its flags, with the same words; an unknown parameter is
// refused.
func FromQuery(q url.Values) (opts podmanfork.Options, err error) {
	err = fromQuery(q, "a fork", PodmanFork(), func(c *cli.Context) (err error) {
		opts, err = ReadPodmanFork(c)
		return err
	})
	return opts, err
}

// fromQuery checks the query parameters q against flags, as the command
// that has them would, and hands them to read; what names the call for
// the error about an unknown parameter.
func fromQuery(q url.Values, what string, flags []cli.Flag, read func(*cli.Context) error) error {
	byKey := map[string]string{}
	for _, f := range flags {
		for _, n := range f.Names() {
			byKey[queryKey(n)] = f.Names()[0]
		}
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"api"}
	for _, k := range keys {
		name, ok := byKey[queryKey(k)]
		if !ok {
			return fmt.Errorf("unknown query parameter %q: %s takes %s", k, what, strings.Join(flagNames(flags), ", "))
		}
		for _, v := range q[k] {
			args = append(args, "--"+name+"="+v)
		}
	}
	app := &cli.App{
		Name: "api", Flags: flags, HideHelp: true, HideVersion: true,
		// A hook or label may hold commas: each parameter is one value.
		DisableSliceFlagSeparator: true,
		Writer:                    io.Discard, ErrWriter: io.Discard,
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return err },
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected value %q", c.Args().First())
			}
			return read(c)
		},
	}
	return app.Run(args)
}

// queryKey folds a flag or parameter name: readyTimeout, ready-timeout and
// ready_timeout are one.
func queryKey(s string) string {
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(s))
}

func flagNames(flags []cli.Flag) []string {
	var names []string
	for _, f := range flags {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		names = append(names, f.Names()[0])
	}
	sort.Strings(names)
	return names
}
