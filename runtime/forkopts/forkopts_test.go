package forkopts

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTCPFromFlags(t *testing.T) {
	for _, c := range []struct {
		established, close bool
		want               TCPPolicy
	}{
		{false, false, ""},
		{false, true, TCPClose},
		{true, false, TCPKeep},
	} {
		got, err := TCPFromFlags(c.established, c.close)
		if err != nil || got != c.want {
			t.Errorf("TCPFromFlags(%v, %v) = %q, %v; want %q", c.established, c.close, got, err, c.want)
		}
	}
	if _, err := TCPFromFlags(true, true); err == nil {
		t.Error("--tcp-established with --tcp-close accepted")
	}
	if TCPPolicy("").OrClose() != TCPClose || TCPKeep.OrClose() != TCPKeep {
		t.Error("OrClose")
	}
}

// The zero Fork is one sibling, unique, TCP closed, with the default TTL,
// capture timeout and ghost limit.
func TestNormalizeFillsDefaults(t *testing.T) {
	var f Fork
	if err := f.Normalize(); err != nil {
		t.Fatal(err)
	}
	want := Fork{Capture: Capture{TCP: TCPClose, GhostLimit: DefaultGhostLimit}, Identity: IdentityUnique, Uses: 1, TTL: DefaultPlanTTL, CaptureTimeout: DefaultCaptureTimeout}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("normalized zero Fork = %+v, want %+v", f, want)
	}
	// Normalizing twice changes nothing.
	g := f
	if err := g.Normalize(); err != nil || !reflect.DeepEqual(g, f) {
		t.Fatalf("second Normalize: %+v %v", g, err)
	}
}

func TestNormalizeRefusals(t *testing.T) {
	for _, c := range []struct {
		f    Fork
		says string
	}{
		{Fork{Identity: "clone"}, "identity policy"},
		{Fork{Capture: Capture{TCP: "repair"}}, "TCP policy"},
		{Fork{Uses: -2}, "uses -2"},
		{Fork{TTL: -time.Second}, "TTL"},
		{Fork{CaptureTimeout: -time.Second}, "capture timeout"},
		{Fork{Capture: Capture{GhostLimit: -1}}, "ghost limit"},
		{Fork{Capture: Capture{GhostLimit: 4 * GiB}}, "ghost limit 4G"},
	} {
		f := c.f
		err := f.Normalize()
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Normalize(%+v) = %v, want an error about %s", c.f, err, c.says)
		}
	}
	f := Fork{Uses: Unlimited}
	if err := f.Normalize(); err != nil || f.Uses != Unlimited {
		t.Fatalf("unlimited uses: %d %v", f.Uses, err)
	}
}

// What a dump asks of CRIU, and what its restore must then declare.
func TestDumpAndRestore(t *testing.T) {
	none := func() (bool, error) { return false, nil }
	some := func() (bool, error) { return true, nil }
	for _, c := range []struct {
		name      string
		capture   Capture
		connected func() (bool, error)
		policy    TCPPolicy // the sibling's
		dumped    Dumped
		args      []string
		tcpClose  bool
	}{
		{"close", Capture{TCP: TCPClose, FileLocks: true, GhostLimit: 64 * MiB}, some, TCPClose,
			Dumped{TCPClose: true, FileLocks: true, GhostLimit: 64 << 20}, []string{"--file-locks"}, true},
		{"keep without connections", Capture{TCP: TCPKeep}, none, TCPKeep,
			Dumped{}, nil, false},
		{"keep", Capture{TCP: TCPKeep, ShellJob: true}, some, TCPKeep,
			Dumped{TCPEstablished: true, ShellJob: true}, []string{"--tcp-established", "--shell-job"}, false},
		{"kept state closed by a sibling", Capture{TCP: TCPKeep, ExtUnixSk: true}, some, TCPClose,
			Dumped{TCPEstablished: true, ExtUnixSk: true}, []string{"--ext-unix-sk"}, true},
	} {
		d, err := c.capture.Dump(c.connected)
		if err != nil || d != c.dumped {
			t.Errorf("%s: Dump = %+v, %v; want %+v", c.name, d, err, c.dumped)
			continue
		}
		if d.NeedsNetworkLock() != d.TCPEstablished {
			t.Errorf("%s: network lock %v for %+v", c.name, d.NeedsNetworkLock(), d)
		}
		declared, tcpClose := d.Restore(c.policy)
		if args := declared.flags(); !slices.Equal(args, c.args) || tcpClose != c.tcpClose {
			t.Errorf("%s: Restore(%s) = %q, %v; want %q, %v", c.name, c.policy, args, tcpClose, c.args, c.tcpClose)
		}
	}
}

// Volumes to copy must name clean absolute paths, each destination once.
func TestNormalizeVolumes(t *testing.T) {
	for _, vols := range [][]Volume{
		{{Name: "v", Source: "relative", Destination: "/data"}},
		{{Name: "v", Source: "/a/../b", Destination: "/data"}},
		{{Name: "v", Source: "/a", Destination: "data"}},
		{{Name: "v", Source: "/a", Destination: "/data"}, {Name: "w", Source: "/b", Destination: "/data"}},
	} {
		f := Fork{Volumes: vols}
		if err := f.Normalize(); err == nil {
			t.Errorf("volumes %+v accepted", vols)
		}
	}
	f := Fork{Volumes: []Volume{{Name: "v", Source: "/a", Destination: "/data"}, {Name: "w", Source: "/a", Destination: "/logs"}}}
	if err := f.Normalize(); err != nil {
		t.Fatal(err)
	}
}

func TestMemoryCaptureAndResolve(t *testing.T) {
	captures := []struct {
		asked         Memory
		cowOK, twinOK bool
		want          Memory
		err           string
	}{
		{"", true, true, MemoryCow, ""},
		{MemoryAuto, true, false, MemoryCow, ""},
		{"", false, true, MemoryTwin, ""},
		{MemoryAuto, false, true, MemoryTwin, ""},
		{"", false, false, "", ""},
		{MemoryAuto, false, false, "", ""},
		{MemoryCow, true, true, MemoryCow, ""},
		{MemoryCow, false, true, "", "load the vma_cherrypick module"},
		{MemoryTwin, true, true, MemoryTwin, ""},
		{MemoryTwin, false, false, "", "no twin plugin here"},
		{MemoryLazy, true, true, MemoryLazy, ""},
		{MemoryCopy, true, true, MemoryCopy, ""},
		{MemoryKSM, true, true, MemoryKSM, ""},
	}
	for _, c := range captures {
		h := CaptureHost{Cow: c.cowOK, CowWhy: "no module here", Twin: c.twinOK, TwinWhy: "no twin plugin here"}
		got, why, err := c.asked.Capture(h)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Capture(%q, %+v) = %q, %v; want an error saying why and %q", c.asked, h, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want || why == "" {
			t.Errorf("Capture(%q, %+v) = %q (%q), %v; want %q with a reason", c.asked, h, got, why, err, c.want)
		}
	}

	restores := []struct {
		asked, planned Memory
		lazyOK         bool
		want           Memory
		err            string
	}{
		{"", "", true, MemoryLazy, ""},
		{"", "", false, MemoryCopy, ""},
		{MemoryAuto, "", true, MemoryLazy, ""},
		{MemoryLazy, "", false, "", "--memory copy"},
		{MemoryCopy, "", true, MemoryCopy, ""},
		{MemoryKSM, "", true, MemoryLazy, ""},
		{MemoryCow, "", true, "", "fork with --memory cow"},
		{MemoryCow, MemoryCow, true, MemoryCow, ""},
		{MemoryAuto, MemoryCow, true, MemoryCow, ""},
		{MemoryLazy, MemoryCow, true, MemoryLazy, ""},
		{MemoryCopy, MemoryCow, true, "", "holds no page images"},
		{MemoryKSM, MemoryCow, true, "", "holds no page images"},
		{MemoryCow, MemoryCow, false, "", "cannot restore memory lazily"},
		{MemoryTwin, "", true, "", "fork with --memory twin"},
		{"", MemoryTwin, true, MemoryLazy, ""},
		{MemoryAuto, MemoryTwin, true, MemoryLazy, ""},
		{MemoryLazy, MemoryTwin, true, MemoryLazy, ""},
		{MemoryTwin, MemoryTwin, true, MemoryLazy, ""},
		{MemoryCow, MemoryTwin, true, "", "held by twins"},
		{MemoryCopy, MemoryTwin, true, "", "holds no page images"},
		{"", MemoryTwin, false, "", "cannot restore memory lazily"},
	}
	for _, c := range restores {
		got, err := c.asked.Resolve(c.planned, c.lazyOK, "no userfaultfd")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Resolve(%q, plan %q, %v) = %q, %v; want an error with %q", c.asked, c.planned, c.lazyOK, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Resolve(%q, plan %q, %v) = %q, %v; want %q", c.asked, c.planned, c.lazyOK, got, err, c.want)
		}
	}
	for _, s := range []string{"cow", "twin", "auto", ""} {
		if _, err := ParseMemory(s); err != nil {
			t.Errorf("ParseMemory(%q): %v", s, err)
		}
	}
	if _, err := ParseMemory("share"); err == nil || !strings.Contains(err.Error(), "auto, cow, twin, lazy, copy or ksm") {
		t.Errorf("ParseMemory of an unknown mode: %v", err)
	}
}

// flags names what a restore declares, as crun's flags.
func (d Dumped) flags() []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{d.TCPEstablished, "--tcp-established"}, {d.FileLocks, "--file-locks"}, {d.ExtUnixSk, "--ext-unix-sk"}, {d.ShellJob, "--shell-job"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}
