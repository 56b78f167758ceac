package podmanflags

import (
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/forkflags"
	"github.com/tclone/tclone/shim/podmanfork"
)

func TestBranchCreateFromQuery(t *testing.T) {
	name, opts, err := BranchCreateFromQuery(url.Values{"name": {"exp-1"}, "label": {"task=a,b", branch.KeepLabel + "=true"},
		"volumeMode": {"db=share"}, "file_locks": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	want := podmanfork.BranchOptions{Labels: map[string]string{"task": "a,b", branch.KeepLabel: "true"},
		VolumeModes: podmanfork.VolumeModes{ByName: map[string]podmanfork.VolumeMode{"db": podmanfork.VolumeShare}}, FileLocks: true}
	if name != "exp-1" || !reflect.DeepEqual(opts, want) {
		t.Errorf("got %q %+v, want %q %+v", name, opts, "exp-1", want)
	}
	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{}, "no branch name: give the query parameter name=NAME"},
		{url.Values{"name": {"a b"}}, `invalid branch name "a b"`},
		{url.Values{"name": {"0123456789abcdef"}}, "it has the form of a branch ID"},
		{url.Values{"name": {"b"}, "count": {"2"}}, `unknown query parameter "count": a branch takes file-locks, label, name, volume-mode`},
		{url.Values{"name": {"b"}, "label": {"io.tclone.fork-call=x"}}, "are set by the fork itself"},
		{url.Values{"name": {"b"}, "volumeMode": {"move"}}, "--volume-mode: volume mode \"move\""},
	} {
		if _, _, err := BranchCreateFromQuery(c.q); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.q, err, c.want)
		}
	}
}

// A branch start takes a fork's flags, but those of the capture are hidden
// and refused: the branch was captured when it was created. A fork's own
// table is not changed by it.
func TestBranchStartHidesAndRefusesCaptureFlags(t *testing.T) {
	capture := []string{"files-only", "capture-timeout", "volume-mode"}
	for _, f := range forkflags.Capture() {
		capture = append(capture, f.Names()[0])
	}
	start := PodmanBranchStart()
	if len(start) != len(PodmanFork()) {
		t.Errorf("a branch start has %d flags, a fork %d", len(start), len(PodmanFork()))
	}
	for _, f := range start {
		name := f.Names()[0]
		hidden := !f.(cli.VisibleFlag).IsVisible()
		if hidden != slices.Contains(capture, name) {
			t.Errorf("--%s is hidden: %v, want %v", name, hidden, !hidden)
		}
		if !hidden {
			continue
		}
		value := "true"
		switch f.(type) {
		case *cli.DurationFlag:
			value = "5s"
		case *cli.StringSliceFlag:
			value = "share"
		}
		want := "--" + name + " says how the source is captured, which the branch already is: give it to podman container branch create"
		if _, err := BranchStartFromQuery(url.Values{name: {value}}); err == nil || err.Error() != want {
			t.Errorf("start with %s=%s: %v, want %q", name, value, err, want)
		}
	}
	for _, f := range PodmanFork() {
		if !f.(cli.VisibleFlag).IsVisible() {
			t.Errorf("a fork's --%s is hidden", f.Names()[0])
		}
	}
}

func TestBranchStartFromQuery(t *testing.T) {
	o, err := BranchStartFromQuery(url.Values{"count": {"2"}, "name": {"w"}, "memory": {"copy"}, "identity": {"preserve"}})
	if err != nil {
		t.Fatal(err)
	}
	if o.Count != 2 || !reflect.DeepEqual(o.Names, []string{"w-1", "w-2"}) || o.Memory != forkopts.MemoryCopy || o.Identity != forkopts.IdentityPreserve {
		t.Errorf("start options not read: %+v", o)
	}
	// The refusal of an unknown parameter lists what a start takes: not
	// the hidden capture flags.
	_, err = BranchStartFromQuery(url.Values{"colour": {"red"}})
	if err == nil || !strings.Contains(err.Error(), `unknown query parameter "colour": a branch start takes `) ||
		!strings.Contains(err.Error(), "count") || strings.Contains(err.Error(), "tcp-close") {
		t.Errorf("unknown parameter: %v", err)
	}
	if _, err := BranchStartFromQuery(url.Values{"count": {"0"}}); err == nil || !strings.Contains(err.Error(), "--count 0: out of range") {
		t.Errorf("count 0: %v, want the fork's refusal", err)
	}
}

func TestBranchPruneFromQuery(t *testing.T) {
	rule, yes, err := BranchPruneFromQuery(url.Values{"keepLast": {"2"}, "older-than": {"72h"}, "source": {"web"},
		"namePrefix": {"exp-"}, "yes": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	want := branch.PruneRule{KeepLast: 2, KeepLastSet: true, OlderThan: 72 * time.Hour, Source: "web", NamePrefix: "exp-"}
	if rule != want || !yes {
		t.Errorf("got %+v yes=%v, want %+v yes=true", rule, yes, want)
	}
	// --keep-last 0 is a rule (remove every selected branch old enough),
	// and without yes, prune only lists.
	rule, yes, err = BranchPruneFromQuery(url.Values{"keepLast": {"0"}})
	if err != nil || !rule.KeepLastSet || rule.KeepLast != 0 || yes {
		t.Errorf("keep-last 0: %+v yes=%v %v, want a rule keeping none, and no removal", rule, yes, err)
	}
	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"source": {"web"}}, "say what to prune: give --keep-last N, --older-than DURATION, or both"},
		{url.Values{"olderThan": {"0s"}}, "--older-than 0s: give a duration above zero"},
		{url.Values{"olderThan": {"-1h"}}, "--older-than -1h0m0s: give a duration above zero"},
		{url.Values{"keepLast": {"-1"}}, "--keep-last -1: give how many of the newest branches of each source to keep, 0 or more"},
		{url.Values{"keepLast": {"1"}, "count": {"1"}}, `unknown query parameter "count": a prune takes keep-last, name-prefix, older-than, source, yes`},
	} {
		if _, _, err := BranchPruneFromQuery(c.q); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.q, err, c.want)
		}
	}
}
