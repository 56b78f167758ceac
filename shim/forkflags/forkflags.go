// Package forkflags derives command-line flags, REST query parameters and
// their reading from flag tables: structs whose fields' tags name their
// flags (see Fields). A fork's options are such a table (forkopts.Fork,
// shared by `tclone fork`, `tclone restore`, `tclone checkpoint` and
// `podman container fork`), and so are the Podman client's (podmanfork
// Options, BranchOptions), whose commands and API service podmanflags
// builds. A flag is spelled and described once, in its field's tag.
package forkflags

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
)

// The groups of a fork's flags (see forkopts.Fork's tags).
const (
	// GroupCapture is what the dump asks of CRIU: --tcp-established,
	// --tcp-close, --file-locks, --ext-unix-sk, --shell-job.
	GroupCapture = "capture"
	// GroupMemory is --memory.
	GroupMemory = "memory"
	// GroupSibling is how siblings differ from the source: --identity.
	GroupSibling = "sibling"
	// GroupFiles is --files-only.
	GroupFiles = "files"
	// GroupPlan is a plan's life: --uses, --ttl.
	GroupPlan = "plan"
	// GroupTimeout is --capture-timeout.
	GroupTimeout = "timeout"
)

// Defaults are the values of a fork's flags that are not given: those
// Normalize fills, but for the TCP policy, which a restore without a TCP
// flag takes from its plan.
func Defaults() forkopts.Fork {
	return forkopts.Fork{Identity: forkopts.IdentityUnique, Uses: forkopts.Unlimited,
		TTL: forkopts.DefaultPlanTTL, CaptureTimeout: forkopts.DefaultCaptureTimeout}
}

// For is the fork flags keep keeps, with their defaults.
func For(keep Keep) []cli.Flag { return Flags(Defaults(), keep) }

// CrunCapture is the capture flags crun itself has, for the verbs tclone
// hands to crun (an ordinary checkpoint): the capture's, less --tcp-close.
func CrunCapture() []cli.Flag {
	return For(func(f Field) bool { return f.Group == GroupCapture && f.Choice != string(forkopts.TCPClose) })
}

// Capture is every capture flag: crun's, and --tcp-close.
func Capture() []cli.Flag { return For(InGroups(GroupCapture)) }

// Sibling is the flags of how siblings differ from the source and get its
// memory.
func Sibling() []cli.Flag { return For(InGroups(GroupMemory, GroupFiles, GroupSibling)) }

// MemoryFlag is --memory.
func MemoryFlag() cli.Flag { return For(InGroups(GroupMemory))[0] }

// PlanLife is the flags of a plan captured on its own: how many siblings it
// serves and how long it is kept.
func PlanLife() []cli.Flag { return For(InGroups(GroupPlan)) }

// Timeout is --capture-timeout.
func Timeout() cli.Flag { return For(InGroups(GroupTimeout))[0] }

// ReadCapture reads the capture flags the command has. It does not fill
// defaults: a restore without a TCP flag takes its plan's policy.
func ReadCapture(c *cli.Context) (forkopts.Capture, error) {
	var f forkopts.Fork
	err := ReadInto(c, &f)
	return f.Capture, err
}

// Read reads every fork flag the command has into a Fork, refusing
// values only a flag can get wrong. A flag the command does not have leaves
// its option zero, for Normalize (which whoever runs the fork calls) to
// fill.
func Read(c *cli.Context) (forkopts.Fork, error) {
	var f forkopts.Fork
	if err := ReadInto(c, &f); err != nil {
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
	if name := NameOf(f, &f.CaptureTimeout); c.IsSet(name) && f.CaptureTimeout <= 0 {
		return &BadValue{Flag: name, Value: f.CaptureTimeout.String(), Advice: "give a positive duration, such as 60s"}
	}
	if name := NameOf(f, &f.Uses); c.IsSet(name) && (f.Uses == 0 || f.Uses < forkopts.Unlimited) {
		return &BadValue{Flag: name, Value: fmt.Sprint(f.Uses), Advice: "give a number of siblings (1 or more), or -1 for any number until the plan expires"}
	}
	if name := NameOf(f, &f.TTL); c.IsSet(name) && f.TTL <= 0 {
		return &BadValue{Flag: name, Value: f.TTL.String(), Advice: "give how long an unused plan is kept, such as 10m"}
	}
	return nil
}

// BadValue names the flag a bad value was given to, and what to give.
type BadValue struct{ Flag, Value, Advice string }

func (e *BadValue) Error() string { return "--" + e.Flag + " " + e.Value + ": " + e.Advice }
