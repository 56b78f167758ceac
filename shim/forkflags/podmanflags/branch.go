package podmanflags

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/shim/flagtable"
	"github.com/tclone/tclone/shim/forkflags"
	"github.com/tclone/tclone/shim/podmanfork"
)

// Names of the flags of a prune.
const (
	KeepLast   = "keep-last"
	OlderThan  = "older-than"
	Source     = "source"
	NamePrefix = "name-prefix"
	Yes        = "yes"
)

// BranchCreate is every flag that says what `podman container branch
// create` keeps: the command's, and the query parameters of the branch
// endpoint of tclone's API service (there, with the branch's name):
// podmanfork.BranchOptions' table.
func BranchCreate() []cli.Flag { return flagtable.Flags(podmanfork.BranchOptions{}, flagtable.All) }

// ReadBranchCreate reads the flags of BranchCreate.
func ReadBranchCreate(c *cli.Context) (podmanfork.BranchOptions, error) {
	var opts podmanfork.BranchOptions
	if err := flagtable.ReadInto(c, &opts); err != nil {
		return podmanfork.BranchOptions{}, err
	}
	return opts, opts.Validate()
}

// BranchCreateFromQuery reads the branch endpoint's query parameters: the
// branch's name, and the flags of BranchCreate.
func BranchCreateFromQuery(q url.Values) (name string, opts podmanfork.BranchOptions, err error) {
	flags := append(BranchCreate(), &cli.StringFlag{Name: "name", Usage: "the branch's name"})
	err = fromQuery(q, "a branch", flags, func(c *cli.Context) (err error) {
		if name = c.String("name"); name == "" {
			return errors.New("no branch name: give the query parameter name=NAME")
		}
		if err := branch.CheckName(name); err != nil {
			return err
		}
		opts, err = ReadBranchCreate(c)
		return err
	})
	return name, opts, err
}

// PodmanBranchStart is the flags of `podman container branch start`: a
// fork's. Those of the capture are hidden, and refused by
// RefuseCaptureFlags with a word on why.
func PodmanBranchStart() []cli.Flag {
	return flagtable.Hide(PodmanFork(), podmanfork.Options{}, podmanfork.CaptureOnly)
}

// RefuseCaptureFlags fails when a flag of the capture was given to a
// branch start.
func RefuseCaptureFlags(c *cli.Context) error {
	if given := flagtable.Given(c, podmanfork.Options{}, podmanfork.CaptureOnly); len(given) > 0 {
		return podmanfork.CaptureOptionError(given[0])
	}
	return nil
}

// ReadBranchStart reads the flags of PodmanBranchStart.
func ReadBranchStart(c *cli.Context) (podmanfork.Options, error) {
	if err := RefuseCaptureFlags(c); err != nil {
		return podmanfork.Options{}, err
	}
	return ReadPodmanFork(c)
}

// BranchStartFromQuery reads the query parameters of a branch's start: those
// of a fork, less the capture's.
func BranchStartFromQuery(q url.Values) (opts podmanfork.Options, err error) {
	err = fromQuery(q, "a branch start", PodmanBranchStart(), func(c *cli.Context) (err error) {
		opts, err = ReadBranchStart(c)
		return err
	})
	return opts, err
}

// ImportFromQuery reads the import endpoint's query parameters:
// podmanfork.ImportOptions' table.
func ImportFromQuery(q url.Values) (opts podmanfork.ImportOptions, err error) {
	err = fromQuery(q, "an import", flagtable.Flags(podmanfork.ImportOptions{}, flagtable.All), func(c *cli.Context) error {
		return flagtable.ReadInto(c, &opts)
	})
	return opts, err
}

// BranchPrune is the flags that select what prune removes.
func BranchPrune() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: KeepLast, Usage: "keep the N newest branches of each source"},
		&cli.DurationFlag{Name: OlderThan, Usage: "remove only branches older than this (such as 72h)"},
		&cli.StringFlag{Name: Source, Usage: "only branches of this container (name or ID)"},
		&cli.StringFlag{Name: NamePrefix, Usage: "only branches whose name begins so"},
		&cli.BoolFlag{Name: Yes, Usage: "remove them"},
	}
}

// ReadBranchPrune reads the flags of BranchPrune.
func ReadBranchPrune(c *cli.Context) (rule branch.PruneRule, yes bool, err error) {
	rule = branch.PruneRule{KeepLast: c.Int(KeepLast), KeepLastSet: c.IsSet(KeepLast), OlderThan: c.Duration(OlderThan),
		Source: c.String(Source), NamePrefix: c.String(NamePrefix)}
	if !rule.KeepLastSet && !c.IsSet(OlderThan) {
		return rule, false, errors.New("say what to prune: give --keep-last N, --older-than DURATION, or both")
	}
	if c.IsSet(OlderThan) && rule.OlderThan <= 0 {
		return rule, false, &forkflags.BadValue{Flag: OlderThan, Value: rule.OlderThan.String(), Advice: "give a duration above zero, such as 72h"}
	}
	if rule.KeepLastSet && rule.KeepLast < 0 {
		return rule, false, &forkflags.BadValue{Flag: KeepLast, Value: fmt.Sprint(rule.KeepLast), Advice: "give how many of the newest branches of each source to keep, 0 or more"}
	}
	return rule, c.Bool(Yes), nil
}

// BranchPruneFromQuery reads the prune endpoint's query parameters.
func BranchPruneFromQuery(q url.Values) (rule branch.PruneRule, yes bool, err error) {
	err = fromQuery(q, "a prune", BranchPrune(), func(c *cli.Context) (err error) {
		rule, yes, err = ReadBranchPrune(c)
		return err
	})
	return rule, yes, err
}
