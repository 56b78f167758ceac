// Package forkflags is the one table of a fork's command-line flags, shared
// by `tclone fork`, `tclone restore`, `tclone checkpoint` and `podman
// container fork`, and the one reader that turns them into a
// forkopts.Fork. A flag is spelled, described and read here only: the flags
// of Podman's fork and branch commands, which only those take, are in
// podmanflags below, so that the runtime binary does not link Podman's client.
package forkflags

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
)

// Flag names.
const (
	TCPEstablished = "tcp-established"
	TCPClose       = "tcp-close"
	FileLocks      = "file-locks"
	ExtUnixSk      = "ext-unix-sk"
	ShellJob       = "shell-job"
	Identity       = "identity"
	Uses           = "uses"
	TTL            = "ttl"
	CaptureTimeout = "capture-timeout"
	Memory         = "memory"
	FilesOnly      = "files-only"
)

// CrunCapture is the capture flags crun itself has, for the verbs tclone
// hands to crun (an ordinary checkpoint).
func CrunCapture() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: TCPEstablished, Usage: "keep open TCP connections: a sibling carries on the source's connections " +
			"(only a sibling in the source's own network namespace; podman container fork refuses it)"},
		&cli.BoolFlag{Name: FileLocks, Usage: "capture and restore file locks"},
		&cli.BoolFlag{Name: ExtUnixSk, Usage: "allow unix sockets connected outside the container"},
		&cli.BoolFlag{Name: ShellJob, Usage: "allow a tree attached to an outside terminal session"},
	}
}

// Capture is every capture flag: crun's, and --tcp-close.
func Capture() []cli.Flag {
	return append(CrunCapture(),
		&cli.BoolFlag{Name: TCPClose, Usage: "close the sibling's copies of the source's open TCP connections; the source keeps them (what a fork does by default)"})
}

// Sibling is the flags of how siblings differ from the source and get its
// memory.
func Sibling() []cli.Flag {
	return []cli.Flag{
		MemoryFlag(),
		&cli.BoolFlag{Name: FilesOnly, Usage: "take the source's files only (root filesystem and volumes, while its processes are held still for a moment): " +
			"each sibling runs its command from the start on them, with none of the source's processes or memory"},
		&cli.StringFlag{Name: Identity, Value: string(forkopts.IdentityUnique), Usage: "unique: each sibling gets its own hostname and machine-id, and a source where one cannot differ (--uts=host, a mounted /etc/machine-id) is refused; " +
			"best-effort: the same where possible, keeping what cannot change (--print-stats says what was kept); preserve: the source's"},
	}
}

// MemoryFlag is --memory.
func MemoryFlag() cli.Flag {
	return &cli.StringFlag{Name: Memory, Usage: "how a sibling gets the source's memory: auto (the default: cow where the vma_cherrypick module is loaded, else twin where tclone's CRIU plugin is installed, else lazy where CRIU " +
		"and the kernel support it, else copy), cow (shared copy-on-write, as fork() shares it: the source is held for page-table copies only, and siblings map its pages), " +
		"twin (copy-on-write without the module: each process gets a twin while the source is held, for page-table copies only, and siblings run at once on copies of its pages), " +
		"lazy (it runs at once and receives copies of its memory while it runs), copy (every page is copied before it runs), or ksm (as lazy, and the sibling is " +
		"mergeable: with a source run with the annotation " + forkopts.AnnotationMerge + "=true, ksmd shares their identical pages again)"}
}

// PlanLife is the flags of a plan captured on its own: how many siblings it
// serves and how long it is kept.
func PlanLife() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: Uses, Value: forkopts.Unlimited, Usage: "how many siblings the plan serves (-1: any number until it expires)"},
		&cli.DurationFlag{Name: TTL, Value: forkopts.DefaultPlanTTL, Usage: "how long an unused plan is kept"},
	}
}

// Timeout is --capture-timeout.
func Timeout() cli.Flag {
	return &cli.DurationFlag{Name: CaptureTimeout, Value: forkopts.DefaultCaptureTimeout,
		Usage: "longest the source may be held for the capture; then CRIU is stopped, the source runs on and the fork fails"}
}

// ReadCapture reads the capture flags the command has. It does not fill
// defaults: a restore without a TCP flag takes its plan's policy.
func ReadCapture(c *cli.Context) (forkopts.Capture, error) {
	tcp, err := forkopts.TCPFromFlags(c.Bool(TCPEstablished), c.Bool(TCPClose))
	if err != nil {
		return forkopts.Capture{}, err
	}
	return forkopts.Capture{
		TCP: tcp, FileLocks: c.Bool(FileLocks), ExtUnixSk: c.Bool(ExtUnixSk), ShellJob: c.Bool(ShellJob),
	}, nil
}

// Read reads every fork flag the command has into a Fork, refusing values
// only a flag can get wrong. A flag the command does not have leaves its
// option zero, for Normalize (which whoever runs the fork calls) to fill.
func Read(c *cli.Context) (forkopts.Fork, error) {
	capture, err := ReadCapture(c)
	if err != nil {
		return forkopts.Fork{}, err
	}
	f := forkopts.Fork{
		Capture:        capture,
		Identity:       forkopts.Identity(c.String(Identity)),
		Memory:         forkopts.Memory(c.String(Memory)),
		FilesOnly:      c.Bool(FilesOnly),
		Uses:           c.Int(Uses),
		TTL:            c.Duration(TTL),
		CaptureTimeout: c.Duration(CaptureTimeout),
	}
	if f.FilesOnly && (f.Memory != "" || f.TCP == forkopts.TCPKeep) {
		return forkopts.Fork{}, fmt.Errorf("--files-only takes none of the source's processes: --memory and --tcp-established do not apply")
	}
	if c.IsSet(CaptureTimeout) && f.CaptureTimeout <= 0 {
		return forkopts.Fork{}, &BadValue{Flag: CaptureTimeout, Value: f.CaptureTimeout.String(), Advice: "give a positive duration, such as 60s"}
	}
	if c.IsSet(Uses) && (f.Uses == 0 || f.Uses < forkopts.Unlimited) {
		return forkopts.Fork{}, &BadValue{Flag: Uses, Value: fmt.Sprint(f.Uses), Advice: "give a number of siblings (1 or more), or -1 for any number until the plan expires"}
	}
	if c.IsSet(TTL) && f.TTL <= 0 {
		return forkopts.Fork{}, &BadValue{Flag: TTL, Value: f.TTL.String(), Advice: "give how long an unused plan is kept, such as 10m"}
	}
	return f, nil
}

// BadValue names the flag a bad value was given to, and what to give.
type BadValue struct{ Flag, Value, Advice string }

func (e *BadValue) Error() string { return "--" + e.Flag + " " + e.Value + ": " + e.Advice }
