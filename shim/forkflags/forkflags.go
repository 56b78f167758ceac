// Package forkflags is a fork's command-line flags, shared by `tclone
// fork`, `tclone restore`, `tclone checkpoint`, `tclone kube fork` and
// `podman container fork`: forkopts.Fork's flag table (see shim/flagtable),
// taken by group, with its defaults, and the reader that refuses what only
// a flag can get wrong. The flags of Podman's fork and branch commands,
// which only those take, are in podmanflags below, so that the runtime
// binary does not link Podman's client.
package forkflags

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/flagtable"
)

// Defaults are the values of a fork's flags that are not given: those
// Normalize fills, but for the TCP policy, which a restore without a TCP
// flag takes from its plan.
func Defaults() forkopts.Fork {
	return forkopts.Fork{Identity: forkopts.IdentityUnique, Uses: forkopts.Unlimited,
		TTL: forkopts.DefaultPlanTTL, CaptureTimeout: forkopts.DefaultCaptureTimeout}
}

// For is the fork flags keep keeps, with their defaults.
func For(keep flagtable.Keep) []cli.Flag { return flagtable.Flags(Defaults(), keep) }

// CrunCapture is the capture flags crun itself has, for the verbs tclone
// hands to crun (an ordinary checkpoint): the capture's, less --tcp-close
// and --ghost-limit.
func CrunCapture() []cli.Flag {
	return For(func(f flagtable.Field) bool {
		return f.Group == forkopts.GroupCapture && f.Choice != string(forkopts.TCPClose) && !dumpOnly(f)
	})
}

// RestoreCapture is the capture flags a restore declares: every one but
// --ghost-limit, which only a dump uses.
func RestoreCapture() []cli.Flag {
	return For(func(f flagtable.Field) bool { return f.Group == forkopts.GroupCapture && !dumpOnly(f) })
}

// dumpOnly tells the capture flags only tclone's dump reads: --ghost-limit.
func dumpOnly(f flagtable.Field) bool {
	var d forkopts.Fork
	return f.Name == flagtable.NameOf(&d, &d.GhostLimit)
}

// Capture is every capture flag: crun's, --tcp-close and --ghost-limit.
func Capture() []cli.Flag { return For(flagtable.InGroups(forkopts.GroupCapture)) }

// Sibling is the flags of how siblings differ from the source and get its
// memory.
func Sibling() []cli.Flag {
	return For(flagtable.InGroups(forkopts.GroupMemory, forkopts.GroupFiles, forkopts.GroupSibling))
}

// MemoryFlag is --memory.
func MemoryFlag() cli.Flag { return For(flagtable.InGroups(forkopts.GroupMemory))[0] }

// PlanLife is the flags of a plan captured on its own: how many siblings it
// serves and how long it is kept.
func PlanLife() []cli.Flag { return For(flagtable.InGroups(forkopts.GroupPlan)) }

// Timeout is --capture-timeout.
func Timeout() cli.Flag { return For(flagtable.InGroups(forkopts.GroupTimeout))[0] }

// ReadCapture reads the capture flags the command has. It does not fill
// defaults: a restore without a TCP flag takes its plan's policy.
func ReadCapture(c *cli.Context) (forkopts.Capture, error) {
	var f forkopts.Fork
	err := flagtable.ReadInto(c, &f)
	return f.Capture, err
}

// Read reads every fork flag the command has into a Fork, refusing
// values only a flag can get wrong. A flag the command does not have leaves
// its option zero, for Normalize (which whoever runs the fork calls) to
// fill.
func Read(c *cli.Context) (forkopts.Fork, error) {
	var f forkopts.Fork
	if err := flagtable.ReadInto(c, &f); err != nil {
		return forkopts.Fork{}, err
	}
	return f, CheckFork(c, &f)
}

// CheckFork refuses the fork flags given values only a flag can get wrong:
// a zero the model would take as its default.
func CheckFork(c *cli.Context, f *forkopts.Fork) error {
	if f.FilesOnly && (f.Memory != "" || f.TCP == forkopts.TCPKeep) {
		return fmt.Errorf("--files-only takes none of the source's processes: --memory and --tcp-established do not apply")
	}
	if name := flagtable.NameOf(f, &f.CaptureTimeout); c.IsSet(name) && f.CaptureTimeout <= 0 {
		return &BadValue{Flag: name, Value: f.CaptureTimeout.String(), Advice: "give a positive duration, such as 60s"}
	}
	if name := flagtable.NameOf(f, &f.Uses); c.IsSet(name) && (f.Uses == 0 || f.Uses < forkopts.Unlimited) {
		return &BadValue{Flag: name, Value: fmt.Sprint(f.Uses), Advice: "give a number of siblings (1 or more), or -1 for any number until the plan expires"}
	}
	if name := flagtable.NameOf(f, &f.TTL); c.IsSet(name) && f.TTL <= 0 {
		return &BadValue{Flag: name, Value: f.TTL.String(), Advice: "give how long an unused plan is kept, such as 10m"}
	}
	return nil
}

// BadValue names the flag a bad value was given to, and what to give.
type BadValue struct{ Flag, Value, Advice string }

func (e *BadValue) Error() string { return "--" + e.Flag + " " + e.Value + ": " + e.Advice }
