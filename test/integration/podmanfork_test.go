package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// podmanCLI is the podman users type: the wrapper in /usr/local/bin that
// sends `podman container fork` to podman-fork.
const podmanCLI = "/usr/local/bin/podman"

func forkCLI(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, 5*time.Minute, podmanCLI, append([]string{"container", "fork"}, args...)...)
}

// siblingsOf lists the containers forked from a source, by label.
func siblingsOf(t *testing.T, src string) []string {
	t.Helper()
	out := podman(t, "ps", "-a", "--filter", "label=io.tclone.forked-from="+containerID(t, src), "--format", "{{.Names}}")
	if out == "" {
		return nil
	}
	return strings.Fields(out)
}

// demoWorkspace starts the demo's workspace: a tmux session running a shell,
// a python http server, and a background job writing a counter.
func demoWorkspace(t *testing.T, extra ...string) string {
	t.Helper()
	n := name(t, "ws")
	args := append([]string{"run", "-d", "--name", n}, extra...)
	args = append(args, workspace, "bash", "-c",
		`cd /srv 2>/dev/null || mkdir -p /srv && cd /srv; echo "hello from $(hostname)" > index.html; `+
			`python3 -m http.server 8080 >/dev/null 2>&1 & `+
			`tmux new-session -d -s main bash; `+
			`i=0; while :; do i=$((i+1)); echo $i > /tmp/c; echo tick $i; sleep 0.5; done`)
	podman(t, args...)
	eventually(t, 20*time.Second, "workspace up", func() error {
		r := podmanTry(t, "exec", n, "curl", "-sf", "http://127.0.0.1:8080/")
		if r.code != 0 {
			return fmt.Errorf("http server: %s", r.stderr)
		}
		return nil
	})
	return n
}

func TestPodmanForkDemoWorkspace(t *testing.T) {
	requireStack(t)
	src := demoWorkspace(t)
	before := readCounter(t, src)
	r := forkCLI(t, src)
	if r.code != 0 {
		t.Fatalf("podman container fork: exit %d: %s", r.code, r.stderr)
	}
	ids := strings.Fields(r.stdout)
	if len(ids) != 1 || len(ids[0]) != 64 {
		t.Fatalf("output %q is not one container ID", r.stdout)
	}
	sib := src + "-fork-1"
	info := inspect(t, sib)
	if info["Id"] != ids[0] {
		t.Fatalf("printed ID %s, inspect says %v", ids[0], info["Id"])
	}
	if got := state(t, sib); got != "running" {
		t.Fatalf("sibling state %q", got)
	}
	labels := podman(t, "inspect", "--format", "{{index .Config.Labels \"io.tclone.forked-from\"}}", sib)
	if labels != containerID(t, src) {
		t.Fatalf("forked-from label %q", labels)
	}
	// Its own identity: hostname, IP, /etc/hosts.
	if h := podman(t, "exec", sib, "hostname"); h != sib {
		t.Errorf("sibling hostname %q, want %q", h, sib)
	}
	if h := podman(t, "exec", src, "hostname"); h == sib {
		t.Error("the source's hostname changed")
	}
	srcIP := podman(t, "inspect", "--format", "{{.NetworkSettings.IPAddress}}", src)
	sibIP := podman(t, "inspect", "--format", "{{.NetworkSettings.IPAddress}}", sib)
	if sibIP == "" || sibIP == srcIP {
		t.Errorf("sibling IP %q, source %q", sibIP, srcIP)
	}
	if hosts := podman(t, "exec", sib, "cat", "/etc/hosts"); !strings.Contains(hosts, sibIP) || !strings.Contains(hosts, sib) {
		t.Errorf("sibling /etc/hosts lacks its own address and name:\n%s", hosts)
	}
	if r := podmanTry(t, "exec", sib, "cat", "/etc/resolv.conf"); r.code != 0 {
		t.Errorf("no resolv.conf in the sibling")
	}
	srcMID, sibMID := podman(t, "exec", src, "cat", "/etc/machine-id"), podman(t, "exec", sib, "cat", "/etc/machine-id")
	if len(sibMID) != 32 || sibMID == srcMID {
		t.Errorf("machine-id: source %q, sibling %q; the sibling needs its own", srcMID, sibMID)
	}
	// Continuity, and the http server answering from the sibling's IP.
	if c := readCounter(t, sib); c < before {
		t.Errorf("sibling counter %d behind the source's pre-fork %d", c, before)
	}
	eventually(t, 10*time.Second, "sibling http server", func() error {
		resp, err := http.Get("http://" + sibIP + ":8080/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), "hello from") {
			return fmt.Errorf("body %q", body)
		}
		return nil
	})
	// exec and logs work on the sibling; its log is its own.
	if out := podman(t, "exec", sib, "sh", "-c", "echo $((6*7))"); out != "42" {
		t.Errorf("exec: %q", out)
	}
	eventually(t, 10*time.Second, "sibling logs", func() error {
		if logs := podman(t, "logs", sib); !strings.Contains(logs, "tick") {
			return fmt.Errorf("logs %q", logs)
		}
		return nil
	})
	// The sibling can be checkpointed like any container, and stopped.
	podman(t, "container", "checkpoint", "--leave-running", "--export", t.TempDir()+"/sib.tar", sib)
	podman(t, "stop", "-t", "2", sib)
	// Removing the sibling leaves the source running and untouched.
	a := readCounter(t, src)
	podman(t, "rm", "-f", sib)
	if got := state(t, src); got != "running" {
		t.Fatalf("source after removing the sibling: %q", got)
	}
	time.Sleep(time.Second)
	if b := readCounter(t, src); b <= a {
		t.Fatalf("source counter stuck: %d then %d", a, b)
	}
	requireNoLeftovers(t)
}

func TestPodmanForkCountAndForkOfFork(t *testing.T) {
	requireStack(t)
	src := demoWorkspace(t)
	r := forkCLI(t, "--count", "3", "--ready", "http:8080/", "--label", "task=42", "--format", "json", src)
	if r.code != 0 {
		t.Fatalf("fork --count 3: exit %d: %s", r.code, r.stderr)
	}
	var results []podmanfork.Result
	if err := json.Unmarshal([]byte(r.stdout), &results); err != nil || len(results) != 3 {
		t.Fatalf("--format json: %v %q", err, r.stdout)
	}
	seenIP := map[string]bool{}
	for _, res := range results {
		if res.RunningMs <= 0 || res.FirstCommandMs != 0 || res.ReadyMs <= 0 || res.IP == "" || seenIP[res.IP] {
			t.Errorf("result %+v", res)
		}
		seenIP[res.IP] = true
		if got := podman(t, "inspect", "--format", "{{index .Config.Labels \"task\"}}", res.Name); got != "42" {
			t.Errorf("%s: label task=%q", res.Name, got)
		}
	}
	if got := len(siblingsOf(t, src)); got != 3 {
		t.Fatalf("%d siblings, want 3", got)
	}
	// A fork of a fork.
	child := results[0].Name
	r = forkCLI(t, "--name", child+"-again", child)
	if r.code != 0 {
		t.Fatalf("fork of a fork: exit %d: %s", r.code, r.stderr)
	}
	grand := child + "-again"
	t.Cleanup(func() { podmanTry(t, "rm", "-f", grand) })
	if c := readCounter(t, grand); c == 0 {
		t.Fatal("grandchild has no counter")
	}
	if got := podman(t, "inspect", "--format", "{{index .Config.Labels \"io.tclone.forked-from\"}}", grand); got != containerID(t, child) {
		t.Errorf("grandchild forked-from %q", got)
	}
	requireNoLeftovers(t)
}

// If the second of three siblings fails (its hook fails), none remain, and
// the source runs on.
func TestPodmanForkAllOrNothing(t *testing.T) {
	requireStack(t)
	src := demoWorkspace(t)
	r := forkCLI(t, "--count", "3", "--name", src+"-aon", "--hook", `[ "$(hostname)" != "`+src+`-aon-2" ]`, src)
	if r.code == 0 {
		t.Fatal("a fork whose second sibling's hook fails succeeded")
	}
	if !strings.Contains(r.stderr, "sibling 2 of 3") || !strings.Contains(r.stderr, "hook") {
		t.Errorf("error does not say which sibling and why: %q", r.stderr)
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings left after a failed fork: %v", left)
	}
	if got := state(t, src); got != "running" {
		t.Fatalf("source after a failed fork: %q", got)
	}
	requireNoLeftovers(t)
	// A hook that succeeds runs in every sibling before it is reported.
	r = forkCLI(t, "--hook", "echo rotated > /tmp/secret", src)
	if r.code != 0 {
		t.Fatalf("fork with a hook: %s", r.stderr)
	}
	if got := podman(t, "exec", src+"-fork-1", "cat", "/tmp/secret"); got != "rotated" {
		t.Errorf("hook did not run in the sibling: %q", got)
	}
	if r := podmanTry(t, "exec", src, "cat", "/tmp/secret"); r.code == 0 {
		t.Error("the hook ran in the source")
	}
}

// All or nothing with lazy memory: of 4 siblings restored at once, the 3rd
// fails (its hook) while the siblings' memory is still being filled. The
// call fails naming it, every sibling is removed, no lazy-pages daemon is
// left serving them, and the source runs on with its memory.
func TestPodmanForkAllOrNothingWhileFilling(t *testing.T) {
	requireStack(t)
	src, _ := workloadOf(t, 512)
	want := workloadCmd(t, podmanExec(src), "probe", "--hash").MemSHA256
	third := src + "-aonf-3"
	// The hook runs in every sibling once it runs; in the 3rd it fails, and
	// says whether that sibling's memory was still arriving (its areas
	// still registered with a userfaultfd: "um" in smaps).
	hook := `[ "$(hostname)" != "` + third + `" ] || { if grep -q " um" /proc/1/smaps; then echo "failing while filling" >&2; else echo "failing once filled" >&2; fi; exit 1; }`
	r := forkCLI(t, "--file-locks", "--count", "4", "--parallel", "4", "--memory", "lazy", "--name", src+"-aonf", "--hook", hook, src)
	if r.code == 0 {
		t.Fatal("a fork whose 3rd sibling's hook fails succeeded")
	}
	if !strings.Contains(r.stderr, "sibling 3 of 4") || !strings.Contains(r.stderr, "hook") {
		t.Fatalf("the error does not say which sibling failed and why: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, "failing while filling") {
		t.Fatalf("the 3rd sibling failed only once its memory was complete, so this did not test a failure while filling: %q", r.stderr)
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings left after a failed fork: %v", left)
	}
	eventually(t, 30*time.Second, "no lazy-pages daemon left", func() error {
		if d := lazyDaemons(); len(d) > 0 {
			return fmt.Errorf("lazy-pages daemons (and guards) still running: %v", d)
		}
		return nil
	})
	requireSourceRuns(t, src)
	if got := workloadCmd(t, podmanExec(src), "probe", "--hash").MemSHA256; got != want {
		t.Fatalf("the source's memory hash changed: %s, was %s", got, want)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

func TestPodmanForkPublish(t *testing.T) {
	requireStack(t)
	srcPort, sibPort := freePort(t), freePort(t)
	for sibPort == srcPort {
		sibPort = freePort(t)
	}
	src := demoWorkspace(t, "-p", fmt.Sprintf("%d:8080", srcPort))
	get := func(port int) string {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return "error: " + err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	srcHost := podman(t, "exec", src, "hostname")
	r := forkCLI(t, "-p", fmt.Sprintf("%d:8080", sibPort), "--ready", "tcp:8080", src)
	if r.code != 0 {
		t.Fatalf("fork -p: %s", r.stderr)
	}
	eventually(t, 10*time.Second, "published ports", func() error {
		if got := get(srcPort); !strings.Contains(got, srcHost) {
			return fmt.Errorf("source's port %d answered %q", srcPort, got)
		}
		// The page was written before the fork: the sibling serves the
		// same file, but from its own port.
		if got := get(sibPort); !strings.Contains(got, "hello from") {
			return fmt.Errorf("sibling's port %d answered %q", sibPort, got)
		}
		return nil
	})
	if ports := podman(t, "port", src+"-fork-1"); strings.Contains(ports, fmt.Sprintf(":%d", srcPort)) {
		t.Errorf("the sibling took the source's port: %s", ports)
	}
	// Asking for the source's own host port fails clearly, leaving nothing.
	r = forkCLI(t, "-p", fmt.Sprintf("%d:8080", srcPort), src)
	if r.code == 0 || !strings.Contains(r.stderr, "port") {
		t.Fatalf("a port conflict: exit %d %q", r.code, r.stderr)
	}
	if got := len(siblingsOf(t, src)); got != 1 {
		t.Fatalf("%d siblings after a failed fork, want the 1 from before", got)
	}
	requireNoLeftovers(t)
}

func TestPodmanForkRefusals(t *testing.T) {
	requireStack(t)
	crunCtr := name(t, "crun")
	podman(t, "run", "-d", "--runtime", "crun", "--name", crunCtr, busybox, "sleep", "1000")
	if r := forkCLI(t, crunCtr); r.code == 0 || !strings.Contains(r.stderr, "--runtime tclone") {
		t.Errorf("crun source: exit %d %q", r.code, r.stderr)
	}
	paused := name(t, "paused")
	podman(t, "run", "-d", "--name", paused, busybox, "sleep", "1000")
	podman(t, "pause", paused)
	if r := forkCLI(t, paused); r.code == 0 || !strings.Contains(r.stderr, "unpause") {
		t.Errorf("paused source: exit %d %q", r.code, r.stderr)
	}
	podman(t, "unpause", paused)
	podman(t, "stop", "-t", "0", paused)
	if r := forkCLI(t, paused); r.code == 0 || !strings.Contains(r.stderr, "start it") {
		t.Errorf("stopped source: exit %d %q", r.code, r.stderr)
	}
	if r := forkCLI(t, "no-such-container-x"); r.code == 0 || !strings.Contains(r.stderr, "no-such-container-x") {
		t.Errorf("unknown source: exit %d %q", r.code, r.stderr)
	}
	requireNoLeftovers(t)
}

// Every bad flag is refused against a running source, before anything is
// started or made, in words that say what is wrong.
func TestPodmanForkFlagRefusals(t *testing.T) {
	requireStack(t)
	src := name(t, "flags")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	// What Podman itself says of a bad name.
	podmanSays := podmanTry(t, "run", "--rm", "--name", "bad x", busybox, "true")
	if podmanSays.code == 0 || !strings.Contains(podmanSays.stderr, "names must match") {
		t.Fatalf("podman run --name 'bad x': %d %q", podmanSays.code, podmanSays.stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--count", "0"}, "--count 0"},
		{[]string{"--count", "33"}, "--count 33"},
		{[]string{"--ready", "bogus"}, "readiness"},
		{[]string{"--ready", "tcp:0"}, "port"},
		{[]string{"--ready-timeout", "0s"}, "--ready-timeout"},
		{[]string{"--ready-timeout", "-5s"}, "--ready-timeout"},
		{[]string{"--identity", "x"}, "identity"},
		{[]string{"--label", "novalue"}, "KEY=VALUE"},
		{[]string{"--label", "io.tclone.forked-from=x"}, "io.tclone."},
		{[]string{"--name", "bad/x!"}, "names must match"},
		{[]string{"--name", "bad x"}, "names must match"},
		{[]string{"--name=-x"}, "names must match"},
		{[]string{"-p", "notaport"}, "--publish"},
		{[]string{"-p", "70000:80"}, "--publish"},
		{[]string{"--count", "2", "-p", "18190:80"}, "host port"},
		{[]string{"--hook", ""}, "hook"},
		{[]string{"--format", "yaml"}, "--format"},
	} {
		stderr := refused(t, append(c.args, src)...)
		if !strings.Contains(stderr, c.want) {
			t.Errorf("%v: error %q does not say %q", c.args, stderr, c.want)
		}
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings made by refused calls: %v", left)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// Removing the source while the fork is still making siblings fails the
// fork and leaves nothing.
func TestPodmanForkSourceRemovedMidway(t *testing.T) {
	requireStack(t)
	src := demoWorkspace(t)
	done := make(chan result, 1)
	go func() { done <- forkCLI(t, "--count", "2", "--hook", "sleep 3", src) }()
	eventually(t, 60*time.Second, "first sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	id := containerID(t, src)
	podman(t, "rm", "-f", "-t", "0", src)
	r := <-done
	if r.code == 0 {
		t.Fatal("fork succeeded though its source was removed midway")
	}
	left := podman(t, "ps", "-a", "--filter", "label=io.tclone.forked-from="+id, "--format", "{{.Names}}")
	if left != "" {
		t.Fatalf("siblings left: %s", left)
	}
	requireNoLeftovers(t)
}

// The host agent, in this process, over the REST socket of Podman's own
// service; the light client refuses that service, saying what to connect
// to.
func TestHostAgentOverPodmansService(t *testing.T) {
	requireStack(t)
	ctx, err := bindings.NewConnection(context.Background(), "unix:///run/podman/podman.sock")
	if err != nil {
		t.Fatalf("no Podman service (hack/podman-service.sh start): %v", err)
	}
	src := demoWorkspace(t)
	_, err = podmanfork.Fork(ctx, src, podmanfork.Options{})
	if !errors.Is(err, podmanfork.ErrNotTcloneService) || !strings.Contains(err.Error(), "tclone service") {
		t.Fatalf("the light client over Podman's own service: %v, want ErrNotTcloneService naming tclone's service", err)
	}
	st, err := hostagent.New(plan.DefaultLayout()).ForkHere(ctx, src, podmanfork.Options{Count: 2, Ready: podmanfork.Ready{Kind: podmanfork.ReadyExec}})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Siblings) != 2 || st.SourcePauseMs <= 0 || st.CheckpointMs <= 0 || st.Capture.Tree.Processes < 3 {
		t.Fatalf("stats %+v", st)
	}
	for _, s := range st.Siblings {
		if got := state(t, s.Name); got != "running" {
			t.Errorf("%s: %q", s.Name, got)
		}
		if c := readCounter(t, s.Name); c == 0 {
			t.Errorf("%s: no counter", s.Name)
		}
	}
	// All or nothing through the package too: the second hook fails.
	_, err = hostagent.New(plan.DefaultLayout()).ForkHere(ctx, src, podmanfork.Options{Count: 2, Names: []string{src + "-g1", src + "-g2"},
		Hooks: []string{`[ "$(hostname)" != "` + src + `-g2" ]`}})
	if err == nil {
		t.Fatal("failing hook did not fail the fork")
	}
	for _, n := range []string{src + "-g1", src + "-g2"} {
		if r := podmanTry(t, "container", "exists", n); r.code == 0 {
			t.Errorf("%s left behind", n)
		}
	}
	requireNoLeftovers(t)
}

// A terminal container's sibling gets a terminal of its own, handed to its
// conmon through the console socket.
func TestPodmanForkTTYContainer(t *testing.T) {
	requireStack(t)
	src := name(t, "tty")
	podman(t, "run", "-dt", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	if r := forkCLI(t, "--name", src+"-f", src); r.code != 0 {
		t.Fatalf("fork: %s", r.stderr)
	}
	sib := src + "-f"
	if fd0 := podman(t, "exec", sib, "readlink", "/proc/1/fd/0"); !strings.HasPrefix(fd0, "/dev/pts/") {
		t.Fatalf("sibling's init stdin is %q, not a terminal", fd0)
	}
	if got := podman(t, "exec", "-t", sib, "tty"); !strings.HasPrefix(got, "/dev/pts/") {
		t.Fatalf("exec -t in the sibling: %q", got)
	}
	a := readCounter(t, sib)
	time.Sleep(500 * time.Millisecond)
	if b := readCounter(t, sib); b <= a {
		t.Fatalf("sibling counter stuck at %d", a)
	}
}

// ^C during a fork rolls it back: no sibling, no plan.
// requireForkCancelled waits for a podman-fork sent ^C to fail saying it
// was cancelled, leaving no sibling of src.
func requireForkCancelled(t *testing.T, cmd *exec.Cmd, done <-chan error, stderr *strings.Builder, src string) {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an interrupted fork exited 0")
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("podman-fork did not stop after ^C")
	}
	if !strings.Contains(stderr.String(), "cancelled") {
		t.Errorf("the error does not say the fork was cancelled: %q", stderr.String())
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings left after ^C: %v", left)
	}
}

func TestPodmanForkInterrupted(t *testing.T) {
	requireStack(t)
	src := demoWorkspace(t)
	cmd := exec.Command(podmanForkBin(), "--count", "3", "--hook", "sleep 2", src)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "first sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	requireForkCancelled(t, cmd, done, &stderr, src)
	if got := state(t, src); got != "running" {
		t.Fatalf("source after ^C: %q", got)
	}
	requireNoLeftovers(t)
}
