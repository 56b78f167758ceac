package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// peer is a TCP server on the host, outside every container: it answers
// each line n with "ack n" and remembers, per connection, every number it
// received and how the connection ended.
type peer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*peerConn
}

type peerConn struct {
	remote string
	lines  []int
	ended  error // io.EOF, a reset, ...; nil while open
	closed bool
}

func startPeer(t *testing.T) *peer {
	t.Helper()
	// Plain TCP: Go listens with Multipath TCP by default, which a peer
	// has no need of.
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	// Every address: Podman's bridge, whose gateway the containers
	// connect to, appears only with the first container on it.
	ln, err := lc.Listen(t.Context(), "tcp4", ":0")
	if err != nil {
		t.Fatalf("peer listening: %v", err)
	}
	p := &peer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go p.accept()
	return p
}

func (p *peer) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *peer) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pc := &peerConn{remote: c.RemoteAddr().String()}
		p.mu.Lock()
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		go p.serve(c, pc)
	}
}

func (p *peer) serve(c net.Conn, pc *peerConn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		n, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
		p.mu.Lock()
		if err == nil {
			pc.lines = append(pc.lines, n)
		} else {
			pc.lines = append(pc.lines, -1) // garbage in the stream
		}
		p.mu.Unlock()
		fmt.Fprintf(c, "ack %d\n", n)
	}
	p.mu.Lock()
	pc.closed, pc.ended = true, sc.Err()
	p.mu.Unlock()
}

// snapshot copies the connections' state.
func (p *peer) snapshot() []peerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]peerConn, len(p.conns))
	for i, c := range p.conns {
		out[i] = *c
		out[i].lines = append([]int(nil), c.lines...)
	}
	return out
}

// podmanGateway is the host's address on Podman's default network: a peer
// listening there is outside every container and reachable from each.
func podmanGateway(t *testing.T) string {
	t.Helper()
	for _, gw := range strings.Fields(podman(t, "network", "inspect", "podman", "--format", "{{range .Subnets}}{{.Gateway}} {{end}}")) {
		if ip := net.ParseIP(gw); ip != nil && ip.To4() != nil {
			return gw
		}
	}
	t.Fatal("Podman's default network has no IPv4 gateway")
	return ""
}

// talkerScript holds one connection to the peer and sends it a number
// every 100 ms, writing the peer's answers to /tmp/replies; when the
// connection ends it says so in /tmp/closed.
func talkerScript(host string, port int) string {
	return fmt.Sprintf(`i=0; while :; do i=$((i+1)); echo $i; sleep 0.1; done | nc %s %d > /tmp/replies; echo "ended $?" > /tmp/closed; sleep 100000`, host, port)
}

// tcpCounters reads a network namespace's TCP counters (/proc/PID/net/snmp).
func tcpCounters(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		t.Fatalf("reading TCP counters of %d: %v", pid, err)
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		out := map[string]int64{}
		for i, v := range f[1:] {
			out[names[i]], _ = strconv.ParseInt(v, 10, 64)
		}
		return out
	}
	t.Fatalf("no Tcp counters in /proc/%d/net/snmp", pid)
	return nil
}

func containerPid(t *testing.T, name string) int {
	t.Helper()
	pid, err := strconv.Atoi(podman(t, "inspect", "--format", "{{.State.Pid}}", name))
	if err != nil || pid <= 0 {
		t.Fatalf("pid of %s: %d %v", name, pid, err)
	}
	return pid
}

// requireConversation checks a peer connection's numbers: consecutive, no
// garbage, none repeated.
func requireConversation(t *testing.T, c peerConn) {
	t.Helper()
	for i := 1; i < len(c.lines); i++ {
		if c.lines[i] != c.lines[i-1]+1 {
			t.Fatalf("the peer's conversation with %s broke at %d: %v", c.remote, i, c.lines[max(0, i-3):min(len(c.lines), i+3)])
		}
	}
}

// A source holding a real connection to a server outside the container
// forks without any flag. The source's conversation goes on, uninterrupted;
// the sibling's copy is closed (its nc sees the connection end) and not one
// TCP segment leaves the sibling's network namespace. Keeping the
// connection is refused, saying why.
func TestPodmanForkClosesSiblingConnections(t *testing.T) {
	requireStack(t)
	gw := podmanGateway(t)
	p := startPeer(t)
	src := name(t, "tcp")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", talkerScript(gw, p.port()))
	eventually(t, 20*time.Second, "the source talking to the peer", func() error {
		if c := p.snapshot(); len(c) != 1 || len(c[0].lines) < 5 {
			return fmt.Errorf("connections %+v", c)
		}
		return nil
	})

	r := forkCLI(t, "--tcp-established", src)
	if r.code == 0 || !strings.Contains(r.stderr, "own IP") || !strings.Contains(r.stderr, "closes the siblings' copies") {
		t.Fatalf("--tcp-established: exit %d: %s", r.code, r.stderr)
	}
	if got := len(siblingsOf(t, src)); got != 0 {
		t.Fatalf("a refused fork left %d siblings", got)
	}

	before := p.snapshot()[0]
	r = forkCLI(t, "--print-stats", src)
	if r.code != 0 {
		t.Fatalf("fork of a source with an established connection: exit %d: %s", r.code, r.stderr)
	}
	var st struct {
		Capture struct {
			TCP     string `json:"tcp_policy"`
			Capture struct {
				TCPClose       bool `json:"tcp_close"`
				TCPEstablished bool `json:"tcp_established"`
			} `json:"capture"`
		} `json:"capture"`
		SourcePauseMs float64 `json:"source_pause_ms"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("--print-stats: %v: %s", err, r.stdout)
	}
	if st.Capture.TCP != "close" || !st.Capture.Capture.TCPClose || st.Capture.Capture.TCPEstablished {
		t.Errorf("the capture's TCP policy: %+v", st.Capture)
	}
	t.Logf("source pause %.1f ms", st.SourcePauseMs)
	sib := src + "-fork-1"

	eventually(t, 20*time.Second, "the sibling's copy closed", func() error {
		r := podmanTry(t, "exec", sib, "cat", "/tmp/closed")
		if r.code != 0 {
			return fmt.Errorf("no /tmp/closed in the sibling: %s", r.stderr)
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	after := p.snapshot()
	if len(after) != 1 {
		t.Fatalf("the peer saw %d connections, want the source's one: %+v", len(after), after)
	}
	c := after[0]
	if c.closed {
		t.Fatalf("the source's connection ended: %v", c.ended)
	}
	if len(c.lines) < len(before.lines)+15 {
		t.Fatalf("the source's conversation did not go on: %d numbers before the fork, %d after", len(before.lines), len(c.lines))
	}
	requireConversation(t, c)
	if r := podmanTry(t, "exec", src, "cat", "/tmp/closed"); r.code == 0 {
		t.Fatalf("the source's connection ended: %s", r.stdout)
	}
	// Nothing of TCP left the sibling: no segment, no reset.
	counters := tcpCounters(t, containerPid(t, sib))
	if counters["OutSegs"] != 0 || counters["OutRsts"] != 0 || counters["ActiveOpens"] != 0 {
		t.Fatalf("the sibling's namespace sent TCP: %v", counters)
	}
	requireNoLeftovers(t)
}

// Podman's checkpoint keeps none of the runtime's output: a fork that tclone
// cannot capture must still tell the user tclone's reason, here a file lock
// held without --file-locks.
func TestPodmanForkReportsTcloneErrors(t *testing.T) {
	requireStack(t)
	src := name(t, "lock")
	podman(t, "run", "-d", "--name", src, workspace, "python3", "-c",
		"import fcntl, time; f = open('/tmp/lock', 'w'); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(100000)")
	eventually(t, 20*time.Second, "the lock taken", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/proc/locks"); !strings.Contains(r.stdout, "FLOCK") {
			return fmt.Errorf("no lock yet")
		}
		return nil
	})
	r := forkCLI(t, src)
	if r.code == 0 {
		t.Fatal("a source holding a file lock forked without --file-locks")
	}
	for _, want := range []string{"file locks", "--file-locks", "Some file locks are hold"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("podman container fork did not say %q: %s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "exit status 1") {
		t.Errorf("the user got Podman's runtime failure instead of tclone's reason: %s", r.stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(hostStore.IntentsDir(), "*.result.json")); len(left) != 0 {
		t.Errorf("results left behind: %v", left)
	}
	if got := state(t, src); got != "running" {
		t.Fatalf("source after the failed fork: %s", got)
	}
	if r := forkCLI(t, "--file-locks", src); r.code != 0 {
		t.Fatalf("--file-locks: exit %d: %s", r.code, r.stderr)
	}
	requireNoLeftovers(t)
}

// loopbackTalker holds a TCP connection between two processes of the
// container, over its loopback, next to the counter. A bare bundle's new
// network namespace has its loopback down.
// The listener's stdin never ends: at end of file busybox nc closes the
// connection.
const loopbackTalker = `ip link set lo up; (sleep 100000 | nc -l -p 9000 > /dev/null) & sleep 0.5; (while :; do echo x; sleep 0.1; done | nc 127.0.0.1 9000) & ` + counterScript

// talkerBundle is a bundle running loopbackTalker, allowed to bring its
// loopback up.
func talkerBundle(t *testing.T, role string, populate bool) *bundle {
	t.Helper()
	b := newBundle(t, role, populate, "sh", "-c", loopbackTalker)
	c := b.spec.Process.Capabilities
	c.Bounding = append(c.Bounding, "CAP_NET_ADMIN")
	c.Effective = append(c.Effective, "CAP_NET_ADMIN")
	c.Permitted = append(c.Permitted, "CAP_NET_ADMIN")
	b.save(t)
	return b
}

// planOnly captures src with tclone fork --plan-only and returns the plan.
func planOnly(t *testing.T, src *bundle, extra ...string) (string, map[string]any) {
	t.Helper()
	args := append([]string{"fork", "--plan-only", "--uses", "1", "--print-stats"}, extra...)
	r := run(t, time.Minute, tcloneBin(), append(args, src.id)...)
	if r.code != 0 {
		t.Fatalf("fork --plan-only %v: exit %d: %s", extra, r.code, r.stderr)
	}
	var out struct {
		Dir  string         `json:"plan_dir"`
		Plan map[string]any `json:"plan"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("--print-stats: %v: %s", err, r.stdout)
	}
	t.Cleanup(func() { removePlan(out.Dir) })
	return out.Dir, out.Plan
}

// tcp_policy and the dump's TCP options of a plan.json.
func planTCP(t *testing.T, dir string) (policy string, close, established bool) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		TCP     string `json:"tcp_policy"`
		Capture struct {
			TCPClose       bool `json:"tcp_close"`
			TCPEstablished bool `json:"tcp_established"`
		} `json:"capture"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	return p.TCP, p.Capture.TCPClose, p.Capture.TCPEstablished
}

// At the runtime level: keeping connections is refused before the source
// is touched when the sibling has a network namespace of its own; a plan
// records its policy, and its siblings follow it.
func TestBundleForkTCPPolicy(t *testing.T) {
	requireStack(t)
	src := talkerBundle(t, "src", true)
	src.start(t)
	src.counter(t)
	eventually(t, 10*time.Second, "the loopback connection", func() error {
		if r := src.exec(t, "cat", "/proc/net/tcp", "/proc/net/tcp6"); !strings.Contains(r.stdout, " 01 ") {
			return fmt.Errorf("no established connection: %s", r.stdout)
		}
		return nil
	})

	sib := talkerBundle(t, "sib", false)
	r := forkBundle(t, src, sib, nil, "--tcp-established")
	if r.code == 0 || !strings.Contains(r.stderr, "gets a network namespace of its own") || !strings.Contains(r.stderr, "sequence numbers") {
		t.Fatalf("--tcp-established into a new namespace: exit %d: %s", r.code, r.stderr)
	}
	if st := crunState(t, sib.id); st != "" {
		t.Fatalf("the refused sibling exists: %s", st)
	}
	requireRunning(t, src)
	requireNoLeftovers(t)

	// --tcp-close is recorded in the plan and every sibling applies it.
	dir, _ := planOnly(t, src, "--tcp-close")
	if policy, cl, est := planTCP(t, dir); policy != "close" || !cl || est {
		t.Fatalf("plan-only --tcp-close recorded %q close=%v established=%v", policy, cl, est)
	}
	res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--image-path", dir, "--bundle", sib.dir, sib.id)
	if res.code != 0 {
		t.Fatalf("restore of a close plan: %s", res.stderr)
	}
	if sib.counter(t) == 0 {
		t.Fatal("the sibling does not count")
	}
	if r := sib.exec(t, "cat", "/proc/net/tcp", "/proc/net/tcp6"); strings.Contains(r.stdout, " 01 ") {
		t.Errorf("the sibling has an established connection:\n%s", r.stdout)
	}

	// A keep plan captures the connection's state; a sibling outside the
	// source's namespace cannot use it, unless it closes its copies.
	dir, _ = planOnly(t, src, "--tcp-established")
	if policy, cl, est := planTCP(t, dir); policy != "keep" || cl || !est {
		t.Fatalf("plan-only --tcp-established recorded %q close=%v established=%v", policy, cl, est)
	}
	other := talkerBundle(t, "sib", false)
	res = runDetached(t, nil, tcloneBin(), "restore", "--detach", "--image-path", dir, "--bundle", other.dir, other.id)
	if res.code == 0 || !strings.Contains(res.stderr, "--tcp-close") {
		t.Fatalf("a keep plan restored into a new namespace: exit %d: %s", res.code, res.stderr)
	}
	res = runDetached(t, nil, tcloneBin(), "restore", "--detach", "--tcp-close", "--image-path", dir, "--bundle", other.dir, other.id)
	if res.code != 0 {
		t.Fatalf("a keep plan restored with --tcp-close: %s", res.stderr)
	}
	if other.counter(t) == 0 {
		t.Fatal("the second sibling does not count")
	}

	// Into the source's own network namespace, keeping is allowed.
	same := talkerBundle(t, "sib", false)
	var st struct{ Pid int }
	json.Unmarshal([]byte(run(t, time.Minute, "crun", "state", src.id).stdout), &st)
	if st.Pid <= 0 {
		t.Fatalf("no pid for %s", src.id)
	}
	for i, ns := range same.spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			same.spec.Linux.Namespaces[i].Path = fmt.Sprintf("/proc/%d/ns/net", st.Pid)
		}
	}
	same.save(t)
	if r := forkBundle(t, src, same, nil, "--tcp-established"); r.code != 0 {
		t.Fatalf("--tcp-established into the source's network namespace: exit %d: %s", r.code, r.stderr)
	}
	if same.counter(t) == 0 {
		t.Fatal("the sibling in the source's namespace does not count")
	}
	requireRunning(t, src)
	requireNoLeftovers(t)
}

// What CRIU's network lock costs the source's pause, on a busybox
// container holding one loopback connection: a close capture (tcp_close,
// no lock) against a keep capture (tcp_established and the lock). Both
// must work; the numbers are logged.
func TestTCPLockPauseCost(t *testing.T) {
	requireStack(t)
	src := talkerBundle(t, "src", true)
	src.start(t)
	src.counter(t)
	eventually(t, 10*time.Second, "the loopback connection", func() error {
		if r := src.exec(t, "cat", "/proc/net/tcp", "/proc/net/tcp6"); !strings.Contains(r.stdout, " 01 ") {
			return fmt.Errorf("no established connection")
		}
		return nil
	})
	pause := func(plan map[string]any) float64 {
		timings, _ := plan["timings"].(map[string]any)
		v, _ := timings["source_pause_ms"].(float64)
		return v
	}
	var closeMs, keepMs []float64
	for i := 0; i < 5; i++ {
		_, p := planOnly(t, src, "--tcp-close")
		closeMs = append(closeMs, pause(p))
		_, p = planOnly(t, src, "--tcp-established")
		keepMs = append(keepMs, pause(p))
	}
	median := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		slices.Sort(s)
		return s[len(s)/2]
	}
	t.Logf("source pause, close (tcp_close, no lock): %v, median %.1f ms", closeMs, median(closeMs))
	t.Logf("source pause, keep (tcp_established + network lock): %v, median %.1f ms", keepMs, median(keepMs))
	requireRunning(t, src)
}

// An ordinary checkpoint (no fork) restored with --tcp-close: crun 1.21 has
// no such restore flag, so tclone hands it to CRIU, and the restored copy's
// connection is closed.
func TestOrdinaryRestoreTCPClose(t *testing.T) {
	requireStack(t)
	src := talkerBundle(t, "src", true)
	src.start(t)
	src.counter(t)
	eventually(t, 10*time.Second, "the loopback connection", func() error {
		if r := src.exec(t, "cat", "/proc/net/tcp", "/proc/net/tcp6"); !strings.Contains(r.stdout, " 01 ") {
			return fmt.Errorf("no established connection")
		}
		return nil
	})
	img := t.TempDir()
	r := run(t, time.Minute, tcloneBin(), "checkpoint", "--leave-running", "--tcp-established", "--image-path", img, "--work-path", img, src.id)
	if r.code != 0 {
		t.Fatalf("checkpoint: exit %d: %s", r.code, r.stderr)
	}
	dst := talkerBundle(t, "rst", true)
	res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--tcp-close", "--image-path", img, "--work-path", t.TempDir(), "--bundle", dst.dir, dst.id)
	if res.code != 0 {
		t.Fatalf("restore --tcp-close: exit %d: %s", res.code, res.stderr)
	}
	if dst.counter(t) == 0 {
		t.Fatal("the restored container does not count")
	}
	if r := dst.exec(t, "cat", "/proc/net/tcp", "/proc/net/tcp6"); strings.Contains(r.stdout, " 01 ") {
		t.Errorf("the restored copy kept an established connection:\n%s", r.stdout)
	}
	requireRunning(t, src)
}
