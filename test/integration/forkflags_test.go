package integration

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// network makes a Podman network for the test, removed after its
// containers.
func network(t *testing.T, subnet string) string {
	t.Helper()
	n := uniqueName("net")
	podman(t, "network", "create", "--subnet", subnet, n)
	t.Cleanup(func() { podmanTry(t, "network", "rm", "-f", n) })
	return n
}

// A source with a static IP cannot give it to a sibling: without the flag
// the fork fails saying which flag to use, and leaves nothing; with it the
// sibling gets its own address on the same network. A static MAC likewise.
func TestPodmanForkStaticAddresses(t *testing.T) {
	requireStack(t)
	net := network(t, "10.89.77.0/24")
	src := name(t, "static")
	const mac = "92:d0:c6:0a:29:33"
	podman(t, "run", "-d", "--name", src, "--network", net, "--ip", "10.89.77.10", "--mac-address", mac,
		busybox, "sh", "-c", counterScript)
	readCounter(t, src)

	r := forkCLI(t, "--ignore-static-mac", src)
	if r.code == 0 || !strings.Contains(r.stderr, "--ignore-static-ip") {
		t.Fatalf("a static IP without --ignore-static-ip: exit %d %q", r.code, r.stderr)
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("left after the refused fork: %v", left)
	}
	r = forkCLI(t, "--ignore-static-ip", "--ignore-static-mac", "--ready", "exec", src)
	if r.code != 0 {
		t.Fatalf("fork --ignore-static-ip --ignore-static-mac: %s", r.stderr)
	}
	sib := src + "-fork-1"
	ipOf := func(c string) string {
		return podman(t, "inspect", "--format", "{{(index .NetworkSettings.Networks \""+net+"\").IPAddress}}", c)
	}
	macOf := func(c string) string {
		return podman(t, "inspect", "--format", "{{(index .NetworkSettings.Networks \""+net+"\").MacAddress}}", c)
	}
	if got := ipOf(sib); got == "10.89.77.10" || !strings.HasPrefix(got, "10.89.77.") {
		t.Errorf("sibling IP %q", got)
	}
	if got := macOf(sib); got == mac || got == "" {
		t.Errorf("sibling MAC %q, source %s", got, mac)
	}
	if got := ipOf(src); got != "10.89.77.10" {
		t.Errorf("source IP changed to %q", got)
	}
	if c := readCounter(t, sib); c == 0 {
		t.Error("sibling does not count")
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// A hook that runs past --ready-timeout fails the fork in about that time,
// and leaves nothing.
func TestPodmanForkReadyTimeout(t *testing.T) {
	requireStack(t)
	src := name(t, "slow")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	start := time.Now()
	r := forkCLI(t, "--hook", "sleep 60", "--ready-timeout", "3s", src)
	took := time.Since(start)
	if r.code == 0 {
		t.Fatal("a hook past the ready timeout did not fail the fork")
	}
	if !strings.Contains(r.stderr, "sleep 60") || !strings.Contains(r.stderr, "3s") {
		t.Errorf("error does not name the hook and the timeout: %q", r.stderr)
	}
	if took > 40*time.Second {
		t.Errorf("the fork took %s to time out after 3s", took)
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings left: %v", left)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// A source whose /etc/machine-id is mounted from the host cannot give its
// siblings their own: unique refuses it before anything is made;
// best-effort forks it, with its own hostname, and says what it kept.
func TestPodmanForkIdentityBestEffort(t *testing.T) {
	requireStack(t)
	midFile := filepath.Join(t.TempDir(), "machine-id")
	const mid = "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(midFile, []byte(mid+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := name(t, "mid")
	podman(t, "run", "-d", "--name", src, "-v", midFile+":/etc/machine-id:ro", busybox, "sh", "-c", counterScript)
	readCounter(t, src)

	r := forkCLI(t, src)
	if r.code == 0 || !strings.Contains(r.stderr, "--identity best-effort") || !strings.Contains(r.stderr, "/etc/machine-id") {
		t.Fatalf("unique with a mounted machine-id: exit %d %q", r.code, r.stderr)
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("left after the refusal: %v", left)
	}
	r = forkCLI(t, "--identity", "best-effort", "--print-stats", src)
	if r.code != 0 {
		t.Fatalf("best-effort: %s", r.stderr)
	}
	var st struct {
		Siblings []struct {
			Name     string
			Hostname string
			Identity struct {
				Hostname  string   `json:"hostname"`
				MachineID string   `json:"machine_id"`
				Kept      []string `json:"kept"`
			}
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("%v %q", err, r.stdout)
	}
	s := st.Siblings[0]
	if s.Identity.Hostname != "own" || s.Identity.MachineID != "kept" || len(s.Identity.Kept) != 1 ||
		!strings.Contains(s.Identity.Kept[0], "/etc/machine-id") {
		t.Errorf("identity report %+v", s.Identity)
	}
	if got := podman(t, "exec", s.Name, "hostname"); got != s.Name {
		t.Errorf("sibling hostname %q", got)
	}
	if got := podman(t, "exec", s.Name, "cat", "/etc/machine-id"); got != mid {
		t.Errorf("sibling machine-id %q", got)
	}

	// A source in the host's UTS namespace: its siblings keep the host's
	// hostname, which the fork must never change.
	host, _ := os.Hostname()
	utsSrc := name(t, "uts")
	podman(t, "run", "-d", "--name", utsSrc, "--uts=host", busybox, "sh", "-c", counterScript)
	readCounter(t, utsSrc)
	if r := forkCLI(t, utsSrc); r.code == 0 || !strings.Contains(r.stderr, "UTS namespace") {
		t.Fatalf("unique with --uts=host: exit %d %q", r.code, r.stderr)
	}
	r = forkCLI(t, "--identity", "best-effort", "--print-stats", utsSrc)
	if now, _ := os.Hostname(); now != host {
		t.Fatalf("the host's hostname changed from %q to %q", host, now)
	}
	if r.code != 0 {
		t.Fatalf("best-effort with --uts=host: %s", r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("%v %q", err, r.stdout)
	}
	if id := st.Siblings[0].Identity; id.Hostname != "kept" || len(id.Kept) != 1 || !strings.Contains(id.Kept[0], "UTS") {
		t.Errorf("identity report %+v", id)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// --print-stats holds every field the README documents, with sane values.
func TestPodmanForkPrintStats(t *testing.T) {
	requireStack(t)
	src := name(t, "stats")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	r := forkCLI(t, "--print-stats", "--count", "2", "--hook", "true", src)
	if r.code != 0 {
		t.Fatalf("fork: %s", r.stderr)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v %q", err, r.stdout)
	}
	num := func(m map[string]any, key string) float64 {
		v, ok := m[key].(float64)
		if !ok {
			t.Errorf("%s missing or not a number in %v", key, m)
		}
		return v
	}
	if st["source"] != containerID(t, src) {
		t.Errorf("source %v", st["source"])
	}
	if call, _ := st["call"].(string); len(call) < 16 {
		t.Errorf("call %v", st["call"])
	}
	total := num(st, "total_ms")
	if cp := num(st, "checkpoint_ms"); cp <= 0 || cp > total {
		t.Errorf("checkpoint_ms %v of total %v", cp, total)
	}
	if p := num(st, "source_pause_ms"); p <= 0 || p > total {
		t.Errorf("source_pause_ms %v", p)
	}
	capture, _ := st["capture"].(map[string]any)
	for _, k := range []string{"tree", "timings", "pages", "rootfs"} {
		if capture[k] == nil {
			t.Errorf("capture.%s missing", k)
		}
	}
	sibs, _ := st["siblings"].([]any)
	if len(sibs) != 2 {
		t.Fatalf("siblings %v", st["siblings"])
	}
	for _, x := range sibs {
		s := x.(map[string]any)
		for _, k := range []string{"id", "name", "hostname", "ip"} {
			if v, _ := s[k].(string); v == "" {
				t.Errorf("sibling %s empty: %v", k, s)
			}
		}
		running, first := num(s, "running_ms"), num(s, "first_command_ms")
		if num(s, "restore_start_ms") <= 0 || num(s, "restore_ms") <= 0 || num(s, "hook_ms") <= 0 || num(s, "ready_ms") < 0 {
			t.Errorf("sibling timings %v", s)
		}
		if running <= 0 || running > total || first < running || first > total {
			t.Errorf("running_ms %v, first_command_ms %v, total %v", running, first, total)
		}
		// --print-stats waits for each sibling's memory to be complete.
		if mem := num(s, "memory_complete_ms"); mem < running || mem > total {
			t.Errorf("memory_complete_ms %v, running_ms %v, total %v", mem, running, total)
		}
		id, _ := s["identity"].(map[string]any)
		if id["hostname"] != "own" || id["machine_id"] == nil {
			t.Errorf("identity %v", id)
		}
	}
	fmt.Fprintf(os.Stderr, "stats: pause %.1f ms, checkpoint %.1f ms, total %.1f ms\n", st["source_pause_ms"], st["checkpoint_ms"], total)
}

// --count restores its siblings --parallel at a time: with 3 slots the
// three restore calls overlap, with 1 none does. What is compared is when
// each call began and ended, never how long it took.
func TestPodmanForkParallelRestores(t *testing.T) {
	requireStack(t)
	src := name(t, "par")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	type span struct{ start, end float64 }
	restores := func(parallel string) []span {
		t.Helper()
		r := forkCLI(t, "--print-stats", "--count", "3", "--parallel", parallel, "--memory", "lazy", src)
		if r.code != 0 {
			t.Fatalf("fork --parallel %s: %s", parallel, r.stderr)
		}
		var st struct {
			Siblings []struct {
				Name           string
				RestoreStartMs float64 `json:"restore_start_ms"`
				RestoreMs      float64 `json:"restore_ms"`
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 3 {
			t.Fatalf("--print-stats: %v %q", err, r.stdout)
		}
		var spans []span
		for _, s := range st.Siblings {
			spans = append(spans, span{s.RestoreStartMs, s.RestoreStartMs + s.RestoreMs})
			podman(t, "rm", "-f", "-t", "0", s.Name)
		}
		slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
		t.Logf("--parallel %s: restore calls (ms from the request) %v", parallel, spans)
		return spans
	}
	all := restores("3")
	if last, first := all[2].start, min(all[0].end, all[1].end, all[2].end); last >= first {
		t.Errorf("with --parallel 3 the three restores did not all run at once: the last began at %.0f ms, the first ended at %.0f ms", last, first)
	}
	one := restores("1")
	for i := 1; i < len(one); i++ {
		if one[i].start < one[i-1].end {
			t.Errorf("with --parallel 1 restore %d began at %.0f ms, before restore %d ended at %.0f ms", i+1, one[i].start, i, one[i-1].end)
		}
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}
