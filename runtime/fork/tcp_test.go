package fork

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/test/testenv"
)

const tcpHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

// netDir makes a fake /proc/PID/net with the given tcp and tcp6 tables
// (socket states only).
func netDir(t *testing.T, v4, v6 []string) string {
	t.Helper()
	dir := t.TempDir()
	table := func(states []string) string {
		var b strings.Builder
		b.WriteString(tcpHeader)
		for i, st := range states {
			b.WriteString("   " + string(rune('0'+i)) + ": 0100007F:1F90 0100007F:A2C4 " + st + " 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 20 4 30 10 -1\n")
		}
		return b.String()
	}
	os.WriteFile(filepath.Join(dir, "tcp"), []byte(table(v4)), 0o644)
	os.WriteFile(filepath.Join(dir, "tcp6"), []byte(table(v6)), 0o644)
	return dir
}

func TestHasConnectedTCP(t *testing.T) {
	for _, c := range []struct {
		name   string
		v4, v6 []string
		want   bool
	}{
		{"nothing", nil, nil, false},
		{"listeners, closed and time-wait", []string{"0A", "07", "06"}, []string{"0A"}, false},
		{"an established v4 connection", []string{"0A", "01"}, nil, true},
		{"an established v6 connection", []string{"0A"}, []string{"01"}, true},
		{"a half-closed connection", nil, []string{"08"}, true},
		{"a connect in progress", []string{"02"}, nil, true},
	} {
		got, err := hasConnectedTCP(netDir(t, c.v4, c.v6))
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := hasConnectedTCP(t.TempDir()); err == nil {
		t.Error("a namespace without /proc/net/tcp read as no connection")
	}
}

// Close (the default) dumps with tcp_close whatever the namespace holds;
// keep asks for tcp_established only when there is a connection to keep.
func TestDumpTCPOptions(t *testing.T) {
	connected := netDir(t, []string{"01"}, nil)
	idle := netDir(t, []string{"0A"}, nil)
	for _, c := range []struct {
		policy             forkopts.TCPPolicy
		dir                string
		established, close bool
	}{
		{"", connected, false, true},
		{forkopts.TCPClose, connected, false, true},
		{forkopts.TCPClose, idle, false, true},
		{forkopts.TCPKeep, connected, true, false},
		{forkopts.TCPKeep, idle, false, false},
	} {
		got, err := forkopts.Capture{TCP: c.policy, FileLocks: true}.Dump(func() (bool, error) { return hasConnectedTCP(c.dir) })
		if err != nil || got.TCPEstablished != c.established || got.TCPClose != c.close || !got.FileLocks {
			t.Errorf("policy %q in %s: %+v, %v", c.policy, filepath.Base(c.dir), got, err)
		}
	}
}

// The network lock is taken only for a dump that puts connections into
// repair mode, and tcp_close reaches CRIU.
func TestDumpOptionsTCP(t *testing.T) {
	spec := &specs.Spec{Linux: &specs.Linux{}}
	for _, c := range []struct {
		opts forkopts.Dumped
		lock bool
	}{
		{forkopts.Dumped{TCPClose: true}, false},
		{forkopts.Dumped{}, false},
		{forkopts.Dumped{TCPEstablished: true}, true},
	} {
		o, err := dumpOptions(dumpInput{spec: spec, opts: c.opts, unified: true})
		if err != nil {
			t.Fatal(err)
		}
		if o.GetTcpClose() != c.opts.TCPClose || o.GetTcpEstablished() != c.opts.TCPEstablished {
			t.Errorf("%+v: tcp_close %v tcp_established %v", c.opts, o.GetTcpClose(), o.GetTcpEstablished())
		}
		if !o.GetLinkRemap() {
			t.Error("a fork cannot capture files open under a removed name without link_remap")
		}
		if locked := o.NetworkLock == nil; locked != c.lock {
			t.Errorf("%+v: network lock %v, want lock %v", c.opts, o.NetworkLock, c.lock)
		}
	}
}

func specWithNetNS(path string, present bool) *specs.Spec {
	s := &specs.Spec{Linux: &specs.Linux{}}
	if present {
		s.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: path}}
	}
	return s
}

// Keep is allowed only into the source's own network namespace.
func TestCheckKeepTCP(t *testing.T) {
	self, err := netNSInode(os.Getpid())
	if err != nil {
		testenv.Missing(t, "no /proc/self/ns/net: %v", err)
	}
	if err := checkKeepTCP(self, specWithNetNS("/proc/self/ns/net", true), "sib"); err != nil {
		t.Errorf("same namespace by path refused: %v", err)
	}
	if err := checkKeepTCP(self, specWithNetNS("", false), "sib"); err != nil {
		t.Errorf("a sibling sharing the source's (host) namespace refused: %v", err)
	}
	err = checkKeepTCP(self, specWithNetNS("", true), "sib")
	if err == nil || !strings.Contains(err.Error(), "source's address and sequence numbers") || !strings.Contains(err.Error(), "closed") {
		t.Errorf("a new namespace: %v", err)
	}
	if err := checkKeepTCP(self+1, specWithNetNS("/proc/self/ns/net", true), "sib"); err == nil {
		t.Error("another namespace accepted")
	}
	if err := checkKeepTCP(0, specWithNetNS("", true), "sib"); err == nil {
		t.Error("an unknown source namespace accepted")
	}
}

func TestSiblingTCPPolicy(t *testing.T) {
	self, err := netNSInode(os.Getpid())
	if err != nil {
		testenv.Missing(t, "no /proc/self/ns/net: %v", err)
	}
	closePlan := &plan.Plan{ID: "p", TCP: forkopts.TCPClose}
	oldPlan := &plan.Plan{ID: "p"}
	keepPlan := &plan.Plan{ID: "p", TCP: forkopts.TCPKeep, Source: plan.Source{NetNSInode: self}}
	same, fresh := specWithNetNS("/proc/self/ns/net", true), specWithNetNS("", true)
	for _, c := range []struct {
		name string
		p    *plan.Plan
		req  MaterializeRequest
		spec *specs.Spec
		want forkopts.TCPPolicy // "" for a refusal
	}{
		{"close plan", closePlan, MaterializeRequest{}, fresh, forkopts.TCPClose},
		{"a plan without a policy closes", oldPlan, MaterializeRequest{}, fresh, forkopts.TCPClose},
		{"keep asked of a close plan", closePlan, MaterializeRequest{TCP: forkopts.TCPKeep}, same, ""},
		{"keep plan, same namespace", keepPlan, MaterializeRequest{}, same, forkopts.TCPKeep},
		{"keep plan, new namespace", keepPlan, MaterializeRequest{}, fresh, ""},
		{"keep plan closed on request", keepPlan, MaterializeRequest{TCP: forkopts.TCPClose}, fresh, forkopts.TCPClose},
	} {
		got, err := siblingTCPPolicy(c.p, c.req, c.spec)
		if got != c.want || (c.want == "") != (err != nil) {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
