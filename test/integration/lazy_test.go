package integration

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/lazy"
)

// lazyDaemons lists the running lazy-pages daemons, and their guards
// (which share the daemon's command line), whose command line contains
// match.
func lazyDaemons(match ...string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && args[1] == lazy.DaemonCommand && (len(match) == 0 || strings.Contains(string(cmdline), match[0])) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// daemonOf is the lazy-pages daemon of plan id: of the processes with its
// command line, the one whose parent is not one of them (the guard is a
// child of the daemon).
func daemonOf(t *testing.T, id string) int {
	t.Helper()
	procs := lazyDaemons(id + ".sock")
	var daemons []int
	for _, pid := range procs {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 && !slices.Contains(procs, atoi(f[1])) {
			daemons = append(daemons, pid)
		}
	}
	if len(daemons) != 1 {
		t.Fatalf("want one lazy-pages daemon for plan %s, found %v (with guards: %v)", id, daemons, procs)
	}
	return daemons[0]
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// Memory is never wrong: the lazy-pages daemon is killed at a random
// instant while three siblings of one plan receive their memory. Each
// sibling is then either complete, with the source's memory hash, or gone;
// none runs on zeros. tclone gc leaves nothing.
func TestLazyDaemonKilledWhileFilling(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	_, want, planDir, sibs := lazySiblings(t, "lz", 3, "20ms")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	daemon := daemonOf(t, filepath.Base(planDir))
	time.Sleep(time.Duration(rng.Int63n(int64(600 * time.Millisecond))))
	syscall.Kill(daemon, syscall.SIGKILL)

	complete, gone := 0, 0
	for i, sib := range sibs {
		sibExec := func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }
		var verdict string
		eventually(t, 30*time.Second, fmt.Sprintf("sibling %d complete or gone", i), func() error {
			if st := crunState(t, sib.id); st != "running" {
				verdict = "gone (state " + st + ")"
				return nil
			}
			res := sibExec(t, "/workload", "probe", "--hash")
			if res.code != 0 {
				// It may be dying as we ask.
				return fmt.Errorf("probe: exit %d: %s", res.code, res.stderr)
			}
			var p report
			if err := json.Unmarshal([]byte(res.stdout), &p); err != nil {
				return err
			}
			if p.MemSHA256 != want {
				t.Fatalf("sibling %d runs with memory that is not the source's: hash %s, want %s", i, p.MemSHA256, want)
			}
			verdict = "complete"
			return nil
		})
		t.Logf("sibling %d: %s", i, verdict)
		if verdict == "complete" {
			complete++
		} else {
			gone++
		}
	}
	t.Logf("daemon killed: %d siblings complete, %d gone", complete, gone)
	for _, sib := range sibs {
		run(t, time.Minute, tcloneBin(), "delete", "--force", sib.id)
	}
	if g := run(t, 2*time.Minute, tcloneBin(), "gc"); g.code != 0 {
		t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
	}
	id := filepath.Base(planDir)
	for _, pattern := range []string{filepath.Join(hostStore.LazyDir(), id+".*"), filepath.Join(hostStore.LazyImagesDir(), id)} {
		if left, _ := filepath.Glob(pattern); len(left) > 0 {
			t.Errorf("left after gc: %v", left)
		}
	}
	if _, err := os.Stat(planDir); err == nil {
		t.Errorf("the used-up plan %s is still there", planDir)
	}
}

// copyWorkload puts the static workload binary in dir, for a bundle to
// bind-mount at /opt/wl.
func copyWorkload(t *testing.T, dir string) { copyBinary(t, workloadBin(), dir) }

// copyBinary copies the program at bin into dir, under its own name.
func copyBinary(t *testing.T, bin, dir string) {
	t.Helper()
	if out, err := exec.Command("cp", bin, filepath.Join(dir, filepath.Base(bin))).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// lazySiblings starts a workload holding 256 MiB, captures a plan of it for
// n siblings and restores them lazily, the daemon pausing pause between
// background chunks so that they are still filling when it returns. It
// returns the source, its memory hash, the plan and the siblings.
func lazySiblings(t *testing.T, prefix string, n int, pause string) (src *bundle, hash, planDir string, sibs []*bundle) {
	t.Helper()
	bin := t.TempDir()
	copyWorkload(t, bin)
	args := []string{"/opt/wl/workload", "serve", "--mem-mib", "256"}
	src = newBundle(t, prefix+"src", true, args...)
	src.spec.Mounts = append(src.spec.Mounts, mountBind("/opt/wl", bin))
	src.save(t)
	src.start(t)
	srcExec := func(t *testing.T, a ...string) result { return src.exec(t, rewriteWorkload(a)...) }
	hash = workloadCmd(t, srcExec, "probe", "--hash").MemSHA256
	if hash == "" {
		t.Fatal("the source's workload reports no memory hash")
	}
	// The pause is the plan's daemon's: a twin capture starts it (to hold
	// the twins), a lazy plan's first restore does.
	r := runDetached(t, []string{lazy.EnvChunkPause + "=" + pause}, tcloneBin(), "fork", "--plan-only", "--file-locks", "--uses", strconv.Itoa(n), src.id)
	if r.code != 0 {
		t.Fatalf("fork --plan-only: exit %d: %s", r.code, r.stderr)
	}
	planDir = strings.TrimSpace(r.stdout)
	// A restore refused below leaves uses of the plan: it goes with the
	// test, and its daemon with it.
	t.Cleanup(func() { removePlan(planDir) })
	for i := 0; i < n; i++ {
		sbin := t.TempDir()
		copyWorkload(t, sbin)
		sib := newBundle(t, fmt.Sprintf("%ssib%d", prefix, i), false, args...)
		sib.spec.Mounts = append(sib.spec.Mounts, mountBind("/opt/wl", sbin))
		sib.save(t)
		res := runDetached(t, []string{lazy.EnvChunkPause + "=" + pause}, tcloneBin(),
			"restore", "--detach", "--memory", "lazy", "--image-path", planDir, "--bundle", sib.dir, sib.id)
		if res.code != 0 {
			t.Fatalf("restore %d: exit %d: %s", i, res.code, res.stderr)
		}
		sibs = append(sibs, sib)
	}
	return src, hash, planDir, sibs
}

// A sibling started lazily runs before its memory is complete, and a fork
// of it waits for its memory: with a capture timeout too short for that,
// the fork is refused saying why, and the sibling is untouched; with the
// default, the fork waits and its own sibling has the source's memory.
func TestForkOfFillingSibling(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	_, want, planDir, sibs := lazySiblings(t, "lf", 1, "50ms")
	sib := sibs[0]
	sibExec := func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }

	// The daemon is stopped while the first fork tries, so the sibling
	// cannot complete meanwhile.
	daemon := daemonOf(t, filepath.Base(planDir))
	syscall.Kill(daemon, syscall.SIGSTOP)
	if f, err := lazypages.Filling(crunPid(t, sib.id)); err != nil || !f {
		syscall.Kill(daemon, syscall.SIGCONT)
		t.Fatalf("the sibling's memory was complete before the first fork (filling %v, %v)", f, err)
	}
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--capture-timeout", "100ms", sib.id)
	syscall.Kill(daemon, syscall.SIGCONT)
	if r.code == 0 {
		t.Fatal("a fork of a sibling still filling was not refused (its memory completed within 100ms?)")
	}
	if !strings.Contains(r.stderr, "still receiving") {
		t.Fatalf("the refusal does not say why: %s", r.stderr)
	}
	r = run(t, 2*time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--uses", "1", sib.id)
	if r.code != 0 {
		t.Fatalf("a fork of the sibling, once filled: exit %d: %s", r.code, r.stderr)
	}
	plan2 := strings.TrimSpace(r.stdout)
	if got := workloadCmd(t, sibExec, "probe", "--hash").MemSHA256; got != want {
		t.Fatalf("the sibling's memory hash %s, want the source's %s", got, want)
	}
	grand := newBundle(t, "lfgrand", false, "/opt/wl/workload", "serve", "--mem-mib", "256")
	gbin := t.TempDir()
	copyWorkload(t, gbin)
	grand.spec.Mounts = append(grand.spec.Mounts, mountBind("/opt/wl", gbin))
	grand.save(t)
	res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--image-path", plan2, "--bundle", grand.dir, grand.id)
	if res.code != 0 {
		t.Fatalf("restore of the sibling's sibling: exit %d: %s", res.code, res.stderr)
	}
	grandExec := func(t *testing.T, a ...string) result { return grand.exec(t, rewriteWorkload(a)...) }
	if got := workloadCmd(t, grandExec, "probe", "--hash").MemSHA256; got != want {
		t.Fatalf("the sibling's sibling has memory hash %s, want %s", got, want)
	}
}

// `tclone fork --print-stats` of a bundle waits until the sibling's memory
// is complete and says when: once it has printed, no task of the sibling
// still receives memory, and the sibling has the source's.
func TestBundleForkPrintStatsWaitsForMemory(t *testing.T) {
	requireStack(t)
	bin := t.TempDir()
	copyWorkload(t, bin)
	args := []string{"/opt/wl/workload", "serve", "--mem-mib", "256"}
	src := newBundle(t, "pmsrc", true, args...)
	src.spec.Mounts = append(src.spec.Mounts, mountBind("/opt/wl", bin))
	src.save(t)
	src.start(t)
	srcExec := func(t *testing.T, a ...string) result { return src.exec(t, rewriteWorkload(a)...) }
	want := workloadCmd(t, srcExec, "probe", "--hash").MemSHA256

	sbin := t.TempDir()
	copyWorkload(t, sbin)
	sib := newBundle(t, "pmsib", false, args...)
	sib.spec.Mounts = append(sib.spec.Mounts, mountBind("/opt/wl", sbin))
	sib.save(t)
	// Slow filling, so that the sibling runs long before it is complete.
	r := forkBundle(t, src, sib, []string{lazy.EnvChunkPause + "=20ms"}, "--file-locks", "--memory", "lazy", "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	pid := crunPid(t, sib.id)
	if task, err := fork.MemoryFilling(pid); err != nil || task != 0 {
		t.Fatalf("--print-stats returned while task %d of the sibling still receives memory (%v)", task, err)
	}
	var report struct {
		TotalMs          float64 `json:"total_ms"`
		MemoryCompleteMs float64 `json:"memory_complete_ms"`
		Sibling          struct {
			Memory  string
			Timings struct {
				TotalMs          float64 `json:"total_ms"`
				MemoryCompleteMs float64 `json:"memory_complete_ms"`
			}
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatalf("--print-stats is not JSON: %v: %q", err, r.stdout)
	}
	t.Logf("running after %.0f ms, memory complete after %.0f ms", report.TotalMs, report.MemoryCompleteMs)
	if report.Sibling.Memory != "lazy" || report.MemoryCompleteMs <= report.TotalMs ||
		report.Sibling.Timings.MemoryCompleteMs <= report.Sibling.Timings.TotalMs {
		t.Fatalf("implausible memory timings: %s", r.stdout)
	}
	sibExec := func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }
	if got := workloadCmd(t, sibExec, "probe", "--hash").MemSHA256; got != want {
		t.Fatalf("the sibling's memory hash %s, want the source's %s", got, want)
	}
}

// crunPid is the PID of container id's init, as crun reports it.
func crunPid(t *testing.T, id string) int {
	t.Helper()
	r := run(t, time.Minute, "crun", "state", id)
	var st struct{ Pid int }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Pid <= 0 {
		t.Fatalf("crun state %s: exit %d: %s%s", id, r.code, r.stdout, r.stderr)
	}
	return st.Pid
}
