package integration

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// The runtime-level fork of a bare bundle: the sibling continues from the
// fork instant with its own hostname, and the two diverge.
func TestBundleForkContinuesAndDiverges(t *testing.T) {
	requireBundleStack(t)
	// A child that lives as long as the source: the counter's sleeps
	// come and go, and a dump may fall between two.
	src := newBundle(t, "src", true, "sh", "-c", "echo before > /tmp/marker; sleep 1000000 & "+counterScript)
	src.start(t)
	src.counter(t)
	sib := newBundle(t, "sib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.save(t)

	r := forkBundle(t, src, sib, nil, "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	var report struct {
		SourcePauseMs float64 `json:"source_pause_ms"`
		Plan          struct {
			Tree struct{ Processes int }
		}
		Sibling struct{ Hostname string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatalf("--print-stats is not JSON: %v: %q", err, r.stdout)
	}
	if report.SourcePauseMs <= 0 || report.Plan.Tree.Processes < 2 {
		t.Fatalf("implausible report %+v", report)
	}
	if st := crunState(t, sib.id); st != "running" {
		t.Fatalf("sibling state %q", st)
	}
	if h := sib.mustExec(t, "hostname"); h != "sib" {
		t.Fatalf("sibling hostname %q, want its config's", h)
	}
	if h := src.mustExec(t, "hostname"); h != "src" {
		t.Fatalf("source hostname changed to %q", h)
	}
	// Filesystem: the sibling has the source's files, and writes diverge.
	if m := sib.mustExec(t, "cat", "/tmp/marker"); m != "before" {
		t.Fatalf("sibling marker %q", m)
	}
	sib.mustExec(t, "sh", "-c", "echo sibling > /tmp/marker")
	if m := src.mustExec(t, "cat", "/tmp/marker"); m != "before" {
		t.Fatalf("a sibling write reached the source: %q", m)
	}
	// Counters: both run, on their own.
	a, b := src.counter(t), sib.counter(t)
	time.Sleep(500 * time.Millisecond)
	if a2, b2 := src.counter(t), sib.counter(t); a2 <= a || b2 <= b {
		t.Fatalf("counters stuck: source %d->%d, sibling %d->%d", a, a2, b, b2)
	}
	// Ordinary verbs work on the sibling.
	if out := run(t, time.Minute, tcloneBin(), "ps", sib.id); out.code != 0 || !strings.Contains(out.stdout, "PID") {
		t.Fatalf("ps: %d %q", out.code, out.stdout)
	}
	run(t, time.Minute, tcloneBin(), "pause", sib.id)
	if st := crunState(t, sib.id); st != "paused" {
		t.Fatalf("after pause: %q", st)
	}
	run(t, time.Minute, tcloneBin(), "resume", sib.id)
	if out := run(t, time.Minute, tcloneBin(), "kill", sib.id, "KILL"); out.code != 0 {
		t.Fatalf("kill: %s", out.stderr)
	}
	eventually(t, 10*time.Second, "sibling stopped", func() error {
		if st := crunState(t, sib.id); st != "stopped" {
			return errorf("state %q", st)
		}
		return nil
	})
	if out := run(t, time.Minute, tcloneBin(), "delete", sib.id); out.code != 0 {
		t.Fatalf("delete: %s", out.stderr)
	}
	requireRunning(t, src)
	requireNoLeftovers(t)
}

// One plan feeds several siblings; it is removed with its last use.
func TestPlanServesSeveralSiblings(t *testing.T) {
	requireBundleStack(t)
	src := newBundle(t, "src", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--uses", "3", src.id)
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() {
		// Only a failed test leaves the plan; it must not fail the next.
		removePlan(planDir)
	})
	var sibs []*bundle
	for i := 0; i < 3; i++ {
		sib := newBundle(t, "sib", false)
		sib.spec.Process.Args = src.spec.Process.Args
		sib.save(t)
		res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--image-path", planDir, "--bundle", sib.dir, sib.id)
		if res.code != 0 {
			t.Fatalf("restore %d: %s", i, res.stderr)
		}
		sibs = append(sibs, sib)
	}
	for _, s := range sibs {
		if s.counter(t) == 0 {
			t.Fatalf("sibling %s has no counter", s.id)
		}
	}
	extra := newBundle(t, "sib", false)
	res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--image-path", planDir, "--bundle", extra.dir, extra.id)
	if res.code == 0 || !strings.Contains(res.stderr, "used up") {
		t.Fatalf("a fourth sibling from a three-use plan: exit %d %q", res.code, res.stderr)
	}
	if st := crunState(t, extra.id); st != "" {
		t.Fatalf("the refused sibling exists in crun: %q", st)
	}
	requireNoLeftovers(t)
}

// Several forks of one source at once all succeed, one after the other.
func TestConcurrentForksOfOneSource(t *testing.T) {
	requireBundleStack(t)
	src := newBundle(t, "src", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	const n = 3
	sibs := make([]*bundle, n)
	for i := range sibs {
		sibs[i] = newBundle(t, "sib", false)
		sibs[i].spec.Process.Args = src.spec.Process.Args
		sibs[i].save(t)
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range sibs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = forkBundle(t, src, sibs[i], nil)
		}(i)
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("fork %d: exit %d: %s", i, r.code, r.stderr)
		}
		if st := crunState(t, sibs[i].id); st != "running" {
			t.Fatalf("sibling %d: %q", i, st)
		}
	}
	requireRunning(t, src)
	requireNoLeftovers(t)
}

// Sources that cannot be forked are refused with the reason and the fix,
// and nothing is left.
func TestForkRefusesUnfitSources(t *testing.T) {
	requireBundleStack(t)
	sib := newBundle(t, "sib", false)
	if r := forkBundle(t, &bundle{id: "no-such-container"}, sib, nil); r.code == 0 || !strings.Contains(r.stderr, "no such container") {
		t.Fatalf("unknown source: exit %d %q", r.code, r.stderr)
	}
	src := newBundle(t, "src", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	run(t, time.Minute, tcloneBin(), "pause", src.id)
	if r := forkBundle(t, src, sib, nil); r.code == 0 || !strings.Contains(r.stderr, "paused") {
		t.Fatalf("paused source: exit %d %q", r.code, r.stderr)
	}
	if st := crunState(t, src.id); st != "paused" {
		t.Fatalf("a refused fork changed the paused source to %q", st)
	}
	run(t, time.Minute, tcloneBin(), "resume", src.id)
	run(t, time.Minute, tcloneBin(), "kill", src.id, "KILL")
	eventually(t, 10*time.Second, "source stopped", func() error {
		if st := crunState(t, src.id); st != "stopped" {
			return errorf("state %q", st)
		}
		return nil
	})
	if r := forkBundle(t, src, sib, nil); r.code == 0 || !strings.Contains(r.stderr, "stopped") {
		t.Fatalf("stopped source: exit %d %q", r.code, r.stderr)
	}
	// A sibling root with unrelated files is refused before anything runs.
	src2 := newBundle(t, "src", true, "sh", "-c", counterScript)
	src2.start(t)
	src2.counter(t)
	dirty := newBundle(t, "sib", true)
	if r := forkBundle(t, src2, dirty, nil); r.code == 0 || !strings.Contains(r.stderr, "not empty") && !strings.Contains(r.stderr, "has files") {
		t.Fatalf("non-empty sibling root: exit %d %q", r.code, r.stderr)
	}
	if st := crunState(t, dirty.id); st != "" {
		t.Fatalf("refused sibling exists in crun: %q", st)
	}
	requireRunning(t, src2)
	requireNoLeftovers(t)
}
