package forkflags

import (
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/flagtable"
)

// forkFlags is the table of `tclone fork`, which has every fork flag.
// Flags are made afresh for each run: urfave/cli keeps values in them.
func forkFlags() []cli.Flag {
	return For(flagtable.All)
}

// read runs a command with flags on args and returns what Read made of them.
func read(t *testing.T, flags []cli.Flag, args ...string) (forkopts.Fork, error) {
	t.Helper()
	var got forkopts.Fork
	app := &cli.App{Name: "t", Flags: flags, HideHelp: true, Writer: io.Discard, ErrWriter: io.Discard,
		Action: func(c *cli.Context) (err error) {
			got, err = Read(c)
			return err
		}}
	err := app.Run(append([]string{"t"}, args...))
	return got, err
}

// With no flag given, a fork gets the defaults the flags' help states.
func TestReadDefaults(t *testing.T) {
	got, err := read(t, forkFlags())
	if err != nil {
		t.Fatal(err)
	}
	want := forkopts.Fork{Identity: forkopts.IdentityUnique, Uses: forkopts.Unlimited,
		TTL: forkopts.DefaultPlanTTL, CaptureTimeout: forkopts.DefaultCaptureTimeout}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
}

func TestReadEveryFlag(t *testing.T) {
	got, err := read(t, forkFlags(), "--tcp-close", "--file-locks", "--ext-unix-sk", "--shell-job",
		"--identity", "preserve", "--memory", "twin", "--uses", "3", "--ttl", "90s", "--capture-timeout", "7s")
	if err != nil {
		t.Fatal(err)
	}
	want := forkopts.Fork{
		Capture:  forkopts.Capture{TCP: forkopts.TCPClose, FileLocks: true, ExtUnixSk: true, ShellJob: true},
		Identity: forkopts.IdentityPreserve, Memory: forkopts.MemoryTwin,
		Uses: 3, TTL: 90 * time.Second, CaptureTimeout: 7 * time.Second,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("every flag:\n got %+v\nwant %+v", got, want)
	}
	if got, err := read(t, forkFlags(), "--tcp-established"); err != nil || got.TCP != forkopts.TCPKeep {
		t.Errorf("--tcp-established: TCP %q, %v; want %q", got.TCP, err, forkopts.TCPKeep)
	}
}

// A command without a flag leaves its option zero, for Normalize to fill:
// `tclone restore` has the capture flags and --memory only.
func TestReadFlagsTheCommandLacks(t *testing.T) {
	got, err := read(t, append(Capture(), MemoryFlag()), "--memory", "copy")
	if err != nil {
		t.Fatal(err)
	}
	if want := (forkopts.Fork{Memory: forkopts.MemoryCopy}); !reflect.DeepEqual(got, want) {
		t.Errorf("restore's flags:\n got %+v\nwant %+v", got, want)
	}
}

// ReadCapture fills no TCP policy when none is given: a restore then takes
// its plan's.
func TestReadCapture(t *testing.T) {
	for _, c := range []struct {
		args []string
		want forkopts.Capture
	}{
		{nil, forkopts.Capture{}},
		{[]string{"--tcp-close"}, forkopts.Capture{TCP: forkopts.TCPClose}},
		{[]string{"--tcp-established", "--shell-job"}, forkopts.Capture{TCP: forkopts.TCPKeep, ShellJob: true}},
	} {
		var got forkopts.Capture
		app := &cli.App{Name: "t", Flags: Capture(), Writer: io.Discard, ErrWriter: io.Discard,
			Action: func(ctx *cli.Context) (err error) {
				got, err = ReadCapture(ctx)
				return err
			}}
		if err := app.Run(append([]string{"t"}, c.args...)); err != nil || got != c.want {
			t.Errorf("%v: %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
}

// crun's own verbs get crun's capture flags: --tcp-close is tclone's.
func TestCrunCaptureIsCrunsFlags(t *testing.T) {
	var crun, all []string
	for _, f := range CrunCapture() {
		crun = append(crun, f.Names()[0])
	}
	for _, f := range Capture() {
		all = append(all, f.Names()[0])
	}
	if want := []string{"tcp-established", "file-locks", "ext-unix-sk", "shell-job"}; !slices.Equal(crun, want) {
		t.Errorf("crun's capture flags are %v, want %v (crun has no --tcp-close nor --ghost-limit)", crun, want)
	}
	if want := []string{"tcp-established", "tcp-close", "file-locks", "ext-unix-sk", "shell-job", "ghost-limit"}; !slices.Equal(all, want) {
		t.Errorf("Capture() is %v, want %v", all, want)
	}
	var restore []string
	for _, f := range RestoreCapture() {
		restore = append(restore, f.Names()[0])
	}
	if want := []string{"tcp-established", "tcp-close", "file-locks", "ext-unix-sk", "shell-job"}; !slices.Equal(restore, want) {
		t.Errorf("RestoreCapture() is %v, want %v (a restore has no use for --ghost-limit)", restore, want)
	}
}

// What a flag alone can get wrong is refused, saying which flag and what
// to give instead.
func TestReadRefusals(t *testing.T) {
	for _, c := range []struct {
		args    []string
		want    string
		badFlag string // set where the error is a *BadValue
	}{
		{[]string{"--tcp-established", "--tcp-close"}, "--tcp-established and --tcp-close exclude each other", ""},
		{[]string{"--files-only", "--memory", "copy"}, "--files-only takes none of the source's processes", ""},
		{[]string{"--files-only", "--tcp-established"}, "--files-only takes none of the source's processes", ""},
		{[]string{"--capture-timeout", "0s"}, "--capture-timeout 0s: give a positive duration", "capture-timeout"},
		{[]string{"--capture-timeout", "-5s"}, "--capture-timeout -5s: give a positive duration", "capture-timeout"},
		{[]string{"--uses", "0"}, "--uses 0: give a number of siblings (1 or more), or -1", "uses"},
		{[]string{"--uses", "-2"}, "--uses -2: give a number of siblings", "uses"},
		{[]string{"--ttl", "0s"}, "--ttl 0s: give how long an unused plan is kept", "ttl"},
	} {
		_, err := read(t, forkFlags(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
			continue
		}
		var bad *BadValue
		switch {
		case errors.As(err, &bad) && bad.Flag != c.badFlag:
			t.Errorf("%v: a BadValue of --%s, want one of %q", c.args, bad.Flag, c.badFlag)
		case bad == nil && c.badFlag != "":
			t.Errorf("%v: %T, want a BadValue of --%s", c.args, err, c.badFlag)
		}
	}
}

// The edges of what is refused are allowed: any number of uses, and files
// only with the sibling's TCP copies closed (there are none to keep).
func TestReadAllowsTheEdges(t *testing.T) {
	for _, args := range [][]string{
		{"--uses", "-1"},
		{"--uses", "1"},
		{"--files-only", "--tcp-close"},
		{"--files-only"},
	} {
		if _, err := read(t, forkFlags(), args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// The help of --memory and --identity names every value the options take.
func TestHelpNamesEveryValue(t *testing.T) {
	usage := map[string]string{}
	for _, f := range Sibling() {
		usage[f.Names()[0]] = f.(cli.DocGenerationFlag).GetUsage()
	}
	for flag, values := range map[string][]string{
		"memory":   {"auto", "cow", "twin", "lazy", "copy", "ksm"},
		"identity": {"unique", "best-effort", "preserve"},
	} {
		for _, v := range values {
			if !strings.Contains(usage[flag], v+" (") && !strings.Contains(usage[flag], v+":") {
				t.Errorf("--%s's help does not describe %s: %q", flag, v, usage[flag])
			}
		}
	}
}

// --memory's help names the annotation that makes a source mergeable.
func TestMemoryHelpNamesTheAnnotation(t *testing.T) {
	if u := MemoryFlag().(cli.DocGenerationFlag).GetUsage(); !strings.Contains(u, forkopts.AnnotationMerge+"=true") {
		t.Errorf("--memory's help does not name %s: %q", forkopts.AnnotationMerge, u)
	}
}
