package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/plan"
)

// A capture holds its source with CRIU's ptrace only. These tests kill or
// interrupt captures of a Podman container holding 300 MiB at several
// moments while CRIU holds it, and check that the source runs on at once,
// with nobody's help: no tclone gc, no thaw.

// treePids lists pid and its descendants.
func treePids(pid int) []int {
	out := []int{pid}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, treePids(c)...)
			}
		}
	}
	return out
}

// requireUntraced fails unless no process of the tree is traced within the
// timeout.
func requireUntraced(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "source released by CRIU", func() error {
		for _, p := range treePids(pid) {
			if tr := fork.TracerOf(p); tr != 0 {
				return fmt.Errorf("process %d is traced by %d", p, tr)
			}
		}
		return nil
	})
}

// heldWorkload starts a busybox container running the workload with 300 MiB
// of memory, and returns its name and host PID.
func heldWorkload(t *testing.T) (string, int) {
	t.Helper()
	return workloadOf(t, 300)
}

// workloadOf starts a busybox container running the workload with mib MiB
// of memory, and returns its name and host PID.
func workloadOf(t *testing.T, mib int) (string, int) {
	t.Helper()
	n := name(t, "held")
	podman(t, "run", "-d", "--name", n, "-v", workloadBin()+":/workload:ro", busybox,
		"/workload", "serve", "--mem-mib", strconv.Itoa(mib))
	workloadCmd(t, podmanExec(n), "probe")
	pid, err := strconv.Atoi(podman(t, "inspect", "--format", "{{.State.Pid}}", n))
	if err != nil {
		t.Fatal(err)
	}
	return n, pid
}

func podmanExec(n string) execer {
	return func(t *testing.T, a ...string) result { return podmanTry(t, append([]string{"exec", n}, a...)...) }
}

// requireSourceRuns checks that the workload answers, counts on and kept its
// memory intact.
func requireSourceRuns(t *testing.T, n string) {
	t.Helper()
	a := workloadCmd(t, podmanExec(n), "probe", "--hash")
	time.Sleep(300 * time.Millisecond)
	b := workloadCmd(t, podmanExec(n), "probe")
	if b.Counter <= a.Counter {
		t.Fatalf("source counter stuck at %d", a.Counter)
	}
	if !a.MemVerified || len(a.Errors) > 0 {
		t.Fatalf("source damaged: memory verified %v, errors %v", a.MemVerified, a.Errors)
	}
	if got := state(t, n); got != "running" {
		t.Fatalf("podman says the source is %q", got)
	}
}

// startCapture starts `tclone fork --plan-only` of the container and waits
// until CRIU has seized its first task; it returns the tclone command and
// the criu PID.
func startCapture(t *testing.T, id string, pid int, extra ...string) (*exec.Cmd, *strings.Builder, int) {
	t.Helper()
	args := append([]string{"fork", "--plan-only", "--file-locks"}, extra...)
	cmd := exec.Command(tcloneBin(), append(args, id)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t.Cleanup(func() {
		// A capture that finished before it could be stopped made a plan.
		if dir := strings.TrimSpace(stdout.String()); hostStore.Contains(dir) {
			removePlan(dir)
		}
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if tr := fork.TracerOf(pid); tr != 0 {
			return cmd, &stderr, tr
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	t.Fatalf("CRIU never seized %d: %s", pid, stderr.String())
	return nil, nil, 0
}

// waitForPages waits until CRIU writes the pages of a capture in progress;
// false if none appeared while it ran.
func waitForPages(t *testing.T) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pages, _ := filepath.Glob(filepath.Join(plan.ImagesDir(hostStore.Dir("*")), "pages-*.img"))
		for _, p := range pages {
			if st, err := os.Stat(p); err == nil && st.Size() > 0 {
				return true
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Log("no page image appeared")
	return false
}

// captureSizes are the source sizes a test of a capture in progress tries,
// in turn, until its interruption lands while CRIU still holds the source.
// A capture with --memory copy writes every page while it holds the source,
// so a larger source holds it longer; on a fast or idle host the smallest
// one may be done before the interruption lands.
var captureSizes = []int{300, 1200, 3000}

// whileHeld runs attempt against a source of each of captureSizes in turn
// until it reports that its interruption landed while CRIU held the source;
// the path must run: when no size was large enough, the test fails.
func whileHeld(t *testing.T, what string, attempt func(t *testing.T, n string, pid int) bool) {
	t.Helper()
	for _, mib := range captureSizes {
		n, pid := workloadOf(t, mib)
		if attempt(t, n, pid) {
			return
		}
		t.Logf("%s: the capture of %d MiB ended first; trying a larger source", what, mib)
		removeContainers(t, n)
	}
	t.Fatalf("%s: every capture, up to %d MiB, ended before it could be interrupted: the path never ran", what, captureSizes[len(captureSizes)-1])
}

// releaseWait bounds how long the tests wait for the kernel to let a source
// go once its tracer is dead: it should be at once, and this only catches a
// source never released (how long it takes is logged, not judged).
const releaseWait = 30 * time.Second

// Kill -9 tclone and CRIU while CRIU holds the source, at several points of
// the dump: the source runs on at once, before any recovery; tclone gc then
// leaves nothing.
func TestKilledCaptureLeavesSourceRunning(t *testing.T) {
	requireStack(t)
	// Kills land where CRIU only holds tasks by ptrace, or where a task
	// runs CRIU's parasite daemon (which returns to the task's own code
	// when CRIU's socket closes). Kills while CRIU injects a system call
	// into a task, or runs a command in a thread, are
	// TestCaptureSurvivesCRIUKilledInAnInjectedCall's. The page-writing
	// rounds capture with --memory copy, the mode that writes pages while
	// it holds the source (twins and lazy dumps write none there).
	rounds := []struct {
		name string
		wait func(t *testing.T) bool // from the moment CRIU traces the source's first task
	}{
		{"seizing", func(*testing.T) bool { return true }},
		{"writing-pages", waitForPages},
		{"writing-pages-later", func(t *testing.T) bool {
			if !waitForPages(t) {
				return false
			}
			time.Sleep(30 * time.Millisecond)
			return true
		}},
	}
	for _, round := range rounds {
		t.Run(round.name, func(t *testing.T) {
			whileHeld(t, round.name, func(t *testing.T, n string, pid int) bool {
				cmd, _, criu := startCapture(t, containerID(t, n), pid, "--memory", "copy")
				ready := round.wait(t)
				if !ready || fork.TracerOf(pid) == 0 {
					syscall.Kill(criu, syscall.SIGKILL)
					cmd.Process.Signal(syscall.SIGKILL)
					cmd.Wait()
					return false
				}
				syscall.Kill(criu, syscall.SIGKILL)
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				requireUntraced(t, pid, releaseWait)
				requireSourceRuns(t, n)
				return true
			})
		})
	}
	t.Run("post-dump", func(t *testing.T) {
		n, pid := heldWorkload(t)
		r := runDetached(t, []string{"TCLONE_CRASH_AT=criu-killed"}, tcloneBin(), "fork", "--plan-only", "--file-locks", containerID(t, n))
		if r.code != 128+9 {
			t.Fatalf("tclone was not killed in post-dump: exit %d: %s", r.code, r.stderr)
		}
		requireUntraced(t, pid, releaseWait)
		requireSourceRuns(t, n)
		// The recovery of every round's capture leaves nothing, and this
		// source running.
		if g := run(t, time.Minute, tcloneBin(), "gc"); g.code != 0 {
			t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
		}
		requireNoLeftovers(t)
		requireSourceRuns(t, n)
	})
}

// An interrupted capture (^C, or Podman's SIGTERM) and one past its
// --capture-timeout stop CRIU at once; the source runs on and tclone itself
// cleans up.
func TestInterruptedCaptureReleasesSource(t *testing.T) {
	requireStack(t)
	t.Run("SIGTERM", func(t *testing.T) {
		whileHeld(t, "SIGTERM", func(t *testing.T, n string, pid int) bool {
			cmd, stderr, _ := startCapture(t, containerID(t, n), pid, "--memory", "copy")
			if !waitForPages(t) || fork.TracerOf(pid) == 0 {
				cmd.Process.Kill()
				cmd.Wait()
				return false
			}
			signalled := time.Now()
			cmd.Process.Signal(syscall.SIGTERM)
			requireUntraced(t, pid, releaseWait)
			t.Logf("source released %s after SIGTERM", time.Since(signalled))
			if err := cmd.Wait(); err == nil {
				t.Fatal("an interrupted capture exited 0")
			}
			if !strings.Contains(stderr.String(), "cancelled") {
				t.Errorf("the error does not say the capture was cancelled: %q", stderr.String())
			}
			requireNoLeftovers(t)
			requireSourceRuns(t, n)
			return true
		})
	})
	t.Run("timeout", func(t *testing.T) {
		whileHeld(t, "--capture-timeout", func(t *testing.T, n string, pid int) bool {
			start := time.Now()
			r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--memory", "copy", "--capture-timeout", "200ms", containerID(t, n))
			if r.code == 0 {
				removePlan(strings.TrimSpace(r.stdout))
				return false
			}
			if !strings.Contains(r.stderr, "--capture-timeout") {
				t.Errorf("the error does not point to --capture-timeout: %q", r.stderr)
			}
			t.Logf("a capture bounded by 200ms returned after %s", time.Since(start))
			requireUntraced(t, pid, releaseWait)
			requireNoLeftovers(t)
			requireSourceRuns(t, n)
			return true
		})
	})
}

// ^C of podman container fork while tclone's capture holds the source: the
// capture stops (Podman's checkpoint call itself cannot be cancelled) and
// the source is let go at once, not when the dump of its 2 GiB would end.
func TestPodmanForkInterruptedDuringCapture(t *testing.T) {
	requireStack(t)
	n, pid := workloadOf(t, 2048)
	cmd := exec.Command(podmanForkBin(), "--file-locks", n)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for deadline := time.Now().Add(time.Minute); fork.TracerOf(pid) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("CRIU never seized the source: %s", stderr.String())
		}
	}
	cmd.Process.Signal(os.Interrupt)
	interrupted := time.Now()
	requireUntraced(t, pid, releaseWait)
	t.Logf("source released %s after ^C", time.Since(interrupted))
	requireForkCancelled(t, cmd, done, &stderr, n)
	requireNoLeftovers(t)
	requireSourceRuns(t, n)
}

// A container holding a stopped process forks: CRIU's ptrace seize handles
// stopped tasks (inside a frozen cgroup it hung until its timeout). The
// sibling's copy is stopped too, and the source's stays stopped.
func TestForkWithStoppedTask(t *testing.T) {
	requireStack(t)
	src := newBundle(t, "src", true, "sh", "-c",
		"sleep 1000 & echo $! > /tmp/stopped; kill -STOP $!; "+counterScript)
	src.start(t)
	src.counter(t)
	stoppedState := func(b *bundle) string {
		return b.mustExec(t, "sh", "-c", `cut -d" " -f3 /proc/$(cat /tmp/stopped)/stat`)
	}
	eventually(t, 10*time.Second, "the source's sleep stopped", func() error {
		if s := stoppedState(src); s != "T" {
			return fmt.Errorf("state %s", s)
		}
		return nil
	})
	sib := newBundle(t, "sib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.save(t)
	start := time.Now()
	r := forkBundle(t, src, sib, nil)
	if r.code != 0 {
		t.Fatalf("fork of a source with a stopped task: exit %d after %s: %s", r.code, time.Since(start), r.stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the fork took %s", d)
	}
	if s := stoppedState(sib); s != "T" {
		t.Errorf("the sibling's copy of the stopped task is in state %s", s)
	}
	if s := stoppedState(src); s != "T" {
		t.Errorf("the source's stopped task is in state %s after the fork", s)
	}
	requireRunning(t, src)
	a := sib.counter(t)
	time.Sleep(400 * time.Millisecond)
	if b := sib.counter(t); b <= a {
		t.Fatalf("sibling counter stuck at %d", a)
	}
	requireNoLeftovers(t)
}

// A capture of established connections that is killed while CRIU has the
// source's network locked and its sockets in repair mode: the tasks run on
// at once, but the kernel undoes neither. The next recovery (tclone gc, or
// any fork) removes both, and the source's connection carries data again.
func TestKilledCaptureNetworkIsRecovered(t *testing.T) {
	requireStack(t)
	n := name(t, "net")
	podman(t, "run", "-d", "--name", n, busybox, "sh", "-c",
		"sleep 100000 | nc -l -p 9000 > /tmp/recv & sleep 1; i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done | nc 127.0.0.1 9000")
	// The last number the listener wrote, or why there is none: a failed
	// exec, or a last line caught half written, is not a stopped
	// connection.
	reading := func() (int, error) {
		r := podmanTry(t, "exec", n, "sh", "-c", "tail -n 1 /tmp/recv")
		if r.code != 0 {
			return 0, fmt.Errorf("podman exec: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
		}
		v, err := strconv.Atoi(strings.TrimSpace(r.stdout))
		if err != nil {
			return 0, fmt.Errorf("the listener's last line %q: %w", r.stdout, err)
		}
		return v, nil
	}
	received := func() int {
		t.Helper()
		for i := 0; ; i++ {
			v, err := reading()
			if err == nil {
				return v
			}
			if i == 20 {
				t.Fatalf("reading what the connection carried: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	flowing := func(what string) {
		t.Helper()
		eventually(t, 10*time.Second, what, func() error {
			a, err := reading()
			if err != nil {
				return err
			}
			time.Sleep(300 * time.Millisecond)
			b, err := reading()
			if err != nil {
				return err
			}
			if b <= a {
				return fmt.Errorf("the connection carries nothing: %d then %d", a, b)
			}
			return nil
		})
	}
	flowing("connection up")
	netns := podman(t, "inspect", "--format", "{{.NetworkSettings.SandboxKey}}", n)
	pid, _ := strconv.Atoi(podman(t, "inspect", "--format", "{{.State.Pid}}", n))

	id := containerID(t, n)
	locked := func() bool {
		out, _ := exec.Command("nsenter", "--net="+netns, "iptables", "-S").Output()
		return strings.Contains(string(out), "-j CRIU")
	}
	// tclone kills its CRIU in post-dump, when the lock is in place and the
	// connection's sockets in repair mode, then itself.
	crash := func() {
		t.Helper()
		r := runDetached(t, []string{"TCLONE_CRASH_AT=criu-killed"}, tcloneBin(), "fork", "--plan-only", "--tcp-established", id)
		if r.code != 128+9 {
			t.Fatalf("tclone was not killed in post-dump: exit %d: %s", r.code, r.stderr)
		}
		requireUntraced(t, pid, releaseWait)
		if !locked() {
			t.Fatal("no network lock after CRIU was killed in post-dump; was the connection dumped?")
		}
		a := received()
		time.Sleep(500 * time.Millisecond)
		if b := received(); b != a {
			t.Fatalf("the connection carried data (%d then %d) although CRIU's lock is in place", a, b)
		}
	}

	crash()
	g := run(t, time.Minute, tcloneBin(), "gc")
	if g.code != 0 {
		t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
	}
	if locked() {
		t.Fatal("the network lock is still in place after tclone gc")
	}
	flowing("connection carrying data after tclone gc")
	requireNoLeftovers(t)

	// The next capture recovers before anything else.
	crash()
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--tcp-established", id)
	if r.code != 0 {
		t.Fatalf("capture after a killed one: exit %d: %s", r.code, r.stderr)
	}
	removePlan(strings.TrimSpace(r.stdout))
	if locked() {
		t.Fatal("the network lock is still in place after the next capture")
	}
	flowing("connection carrying data after the next capture")
	requireNoLeftovers(t)
}

// A source that a capture of an older tclone froze before it died (its
// journal entry says "frozen") is thawed by the next fork before the source
// is judged: the fork succeeds instead of refusing a "paused" source.
func TestForkThawsSourceLeftFrozenByOlderVersion(t *testing.T) {
	requireBundleStack(t)
	src := newBundle(t, "src", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	// The freezer an older capture froze: cgroup v1's freezer hierarchy, or
	// the source's own cgroup on v2 (the kernel VM's stack stage runs this
	// test there).
	freezer, file, frozen := filepath.Join("/sys/fs/cgroup/freezer/tclone-test", src.id), "freezer.state", "FROZEN"
	if cgroups.Unified() {
		freezer, file, frozen = filepath.Join("/sys/fs/cgroup/tclone-test", src.id), "cgroup.freeze", "1"
	}
	if _, err := os.Stat(freezer); err != nil {
		t.Fatalf("no freezer for the source at %s: %v", freezer, err)
	}
	if err := os.WriteFile(filepath.Join(freezer, file), []byte(frozen), 0); err != nil {
		t.Fatal(err)
	}
	entry := fmt.Sprintf(`{"kind":"capture","owner":{"pid":%d,"start_time":1},"started":"2026-01-01T00:00:00Z","phase":"frozen","source_id":%q,"freezer_dir":%q}`,
		os.Getpid(), src.id, freezer)
	path := filepath.Join(hostStore.JournalDir(), fmt.Sprintf("capture-%d-1.json", os.Getpid()))
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	if st := crunState(t, src.id); st != "paused" {
		t.Fatalf("a frozen source reads as %q", st)
	}
	sib := newBundle(t, "sib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.save(t)
	if r := forkBundle(t, src, sib, nil); r.code != 0 {
		t.Fatalf("fork of a source an older capture left frozen: exit %d: %s", r.code, r.stderr)
	}
	requireRunning(t, src)
	if sib.counter(t) == 0 {
		t.Fatal("the sibling has no counter")
	}
	requireNoLeftovers(t)
}
