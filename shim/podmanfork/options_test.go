package podmanfork

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/flagtable"
)

func TestParseReady(t *testing.T) {
	good := map[string]Ready{
		"":                {Kind: ReadyRunning},
		"running":         {Kind: ReadyRunning},
		"exec":            {Kind: ReadyExec},
		"tcp:8080":        {Kind: ReadyTCP, Port: 8080},
		"http:80/healthz": {Kind: ReadyHTTP, Port: 80, Path: "/healthz"},
		"http:80":         {Kind: ReadyHTTP, Port: 80, Path: "/"},
	}
	for in, want := range good {
		got, err := ParseReady(in)
		if err != nil || got != want {
			t.Errorf("ParseReady(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"tcp", "tcp:0", "tcp:70000", "tcp:80/x", "udp:53", "http:", "ready"} {
		if _, err := ParseReady(bad); err == nil {
			t.Errorf("ParseReady(%q) accepted", bad)
		}
	}
}

// Labels are read as KEY=VALUE; a sibling's may not be tclone's own, a
// branch's only io.tclone.keep.
func TestLabels(t *testing.T) {
	var got Labels
	if err := got.SetFlagValues([]string{"a=1", "b=x=y", "c="}); err != nil || got["a"] != "1" || got["b"] != "x=y" || got["c"] != "" {
		t.Fatalf("%v %v", got, err)
	}
	if v := got.FlagValues(); strings.Join(v, " ") != "a=1 b=x=y c=" {
		t.Errorf("FlagValues %q", v)
	}
	for _, bad := range [][]string{{"novalue"}, {"=x"}} {
		var l Labels
		if err := l.SetFlagValues(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if err := (Options{Labels: Labels{LabelForkedFrom: "x"}}).Validate(); err == nil {
		t.Errorf("a sibling's label %s accepted", LabelForkedFrom)
	}
	if err := (BranchOptions{Labels: Labels{LabelKeep: "true"}}).Validate(); err != nil {
		t.Errorf("a branch's %s refused: %v", LabelKeep, err)
	}
	if err := (BranchOptions{Labels: Labels{LabelForkedFrom: "x"}}).Validate(); err == nil {
		t.Errorf("a branch's label %s accepted", LabelForkedFrom)
	}
}

// What the service answers an error of a kind with, the client reads back
// as that kind.
func TestStatusRoundTrip(t *testing.T) {
	for _, kind := range []error{ErrInvalidOption, ErrNoSuchSource, ErrConflict} {
		if got := kindOfStatus(HTTPStatus(WithKind(kind, errors.New("x")))); got != kind {
			t.Errorf("%v comes back as %v", kind, got)
		}
	}
}

func TestParseVolumeModes(t *testing.T) {
	m, err := ParseVolumeModes([]string{"share", "db=copy", "cache=share"})
	if err != nil || m.Default != VolumeShare || m.ByName["db"] != VolumeCopy || m.ByName["cache"] != VolumeShare {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range [][]string{{"both"}, {"copy", "share"}, {"=copy"}, {"db=copy", "db=share"}, {"db=move"}} {
		if _, err := ParseVolumeModes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A branch's start refuses an option of the capture before it asks the
// service anything: the branch was captured when it was created.
func TestStartBranchRefusesCaptureOptions(t *testing.T) {
	for flag, o := range map[string]Options{
		"files-only":      {Fork: forkopts.Fork{FilesOnly: true}},
		"file-locks":      {Fork: forkopts.Fork{Capture: forkopts.Capture{FileLocks: true}}},
		"capture-timeout": {Fork: forkopts.Fork{CaptureTimeout: time.Second}},
		"volume-mode":     {VolumeModes: VolumeModes{Default: VolumeShare}},
	} {
		_, err := StartBranch(context.Background(), "b", o)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "--"+flag+" says how the source is captured") {
			t.Errorf("%s: %v", flag, err)
		}
	}
}

// The fork endpoint is not sent the plan's life, which is the service's.
func TestForkQueryLeavesThePlansLife(t *testing.T) {
	q := flagtable.Query(Options{Count: 2, Fork: forkopts.Fork{Uses: 3, TTL: time.Minute}}, ForkQuery)
	if q.Has("uses") || q.Has("ttl") || q.Get("count") != "2" {
		t.Errorf("query %v", q)
	}
}
