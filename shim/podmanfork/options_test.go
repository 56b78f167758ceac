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

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels([]string{"a=1", "b=x=y", "c="})
	if err != nil || got["a"] != "1" || got["b"] != "x=y" || got["c"] != "" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range [][]string{{"novalue"}, {"=x"}, {LabelForkedFrom + "=x"}} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("%v accepted", bad)
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
