// Package podmanflags is the table of the flags of `podman container fork`
// and `podman container branch` beyond the fork flags of forkflags, and
// their readers, from a command line or from the query of a request to
// tclone's API service.
package podmanflags

import (
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/shim/flagtable"
	"github.com/tclone/tclone/shim/forkflags"
	"github.com/tclone/tclone/shim/podmanfork"
)

// Defaults are the values of the flags of a Podman fork that are not given.
func Defaults() podmanfork.Options {
	return podmanfork.Options{Fork: forkflags.Defaults(), Count: 1,
		Ready: podmanfork.Ready{Kind: podmanfork.ReadyRunning}, ReadyTimeout: podmanfork.DefaultReadyTimeout}
}

// PodmanFork is every flag that says what a `podman container fork` makes:
// the command's, and the query parameters of the fork endpoint of tclone's
// API service (see FromQuery), both podmanfork.Options' table less the
// plan's life. How the command prints its result and where it connects are
// the command's own.
func PodmanFork() []cli.Flag { return flagtable.Flags(Defaults(), podmanfork.ForkQuery) }

// ReadPodmanFork reads the flags of PodmanFork into fork options, refusing
// what a flag alone can get wrong; Options.Validate checks the rest.
func ReadPodmanFork(c *cli.Context) (podmanfork.Options, error) {
	var opts podmanfork.Options
	if err := flagtable.ReadInto(c, &opts); err != nil {
		return podmanfork.Options{}, err
	}
	if err := forkflags.CheckFork(c, &opts.Fork); err != nil {
		return podmanfork.Options{}, err
	}
	name := func(field any) string { return flagtable.NameOf(&opts, field) }
	if opts.Count < 1 || opts.Count > podmanfork.MaxCount {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: name(&opts.Count), Value: fmt.Sprint(opts.Count), Advice: fmt.Sprintf("out of range: fork 1 to %d siblings at a time", podmanfork.MaxCount)}
	}
	// 0 is the default (one per CPU, up to 4), but only when not given.
	if p := opts.Parallel; c.IsSet(name(&opts.Parallel)) && (p < 1 || p > podmanfork.MaxCount) {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: name(&opts.Parallel), Value: fmt.Sprint(p), Advice: fmt.Sprintf("out of range: restore 1 to %d siblings at a time", podmanfork.MaxCount)}
	}
	if d := opts.ReadyTimeout; d <= 0 {
		return podmanfork.Options{}, &forkflags.BadValue{Flag: name(&opts.ReadyTimeout), Value: d.String(), Advice: "give a duration above zero, such as 30s"}
	}
	var err error
	opts.Names, err = siblingNames(opts.Names, opts.Count, name(&opts.Names))
	return opts, err
}

// siblingNames reads --name: one name (NAME, or NAME-1..NAME-N for N
// siblings) or one per sibling.
func siblingNames(given []string, count int, flag string) ([]string, error) {
	for _, name := range given {
		if err := podmanfork.CheckName(name); err != nil {
			return nil, fmt.Errorf("--%s: %w", flag, err)
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
		return nil, &forkflags.BadValue{Flag: flag, Value: strings.Join(given, ","), Advice: fmt.Sprintf("%d names for %d siblings: give one name (NAME-1..NAME-N), or one per sibling", len(given), count)}
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
