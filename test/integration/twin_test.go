package integration

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/procfs"
)

// A twin capture needs tclone's CRIU plugin, which the set-up builds
// (hack/build-criu.sh): where the stack is, it is too.
func requireTwins(t *testing.T) {
	t.Helper()
	for _, p := range []string{"/usr/local/lib/tclone/criu/plugins/tclone_twin.so", "/usr/local/lib/tclone/criu/criu"} {
		if _, err := os.Stat(p); err != nil {
			stackMissing(t, []string{p + " (hack/build-criu.sh)"})
		}
	}
}

// testCgroupFile reads one value file of bundle b's cgroup, in the v1
// hierarchy controller or in cgroup v2.
func testCgroupFile(t *testing.T, b *bundle, controller, v1, v2 string) int64 {
	t.Helper()
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup", controller, "tclone-test", b.id, v1),
		filepath.Join("/sys/fs/cgroup/tclone-test", b.id, v2),
	} {
		if data, err := os.ReadFile(p); err == nil {
			n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", p, data)
			}
			return n
		}
	}
	t.Fatalf("no %s/%s of %s", v1, v2, b.id)
	return 0
}

// twinsOf lists the twins (live or zombie) among the children of the
// processes of b.
func twinsOf(t *testing.T, b *bundle) []string { return twinsUnder(crunPid(t, b.id)) }

// podmanTwins lists the twins in Podman container name.
func podmanTwins(t *testing.T, name string) []string {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(podman(t, "inspect", "--format", "{{.State.Pid}}", name)))
	if err != nil || pid <= 0 {
		t.Fatalf("the pid of %s: %v", name, err)
	}
	return twinsUnder(pid)
}

// twinsUnder lists the twins (live or zombie) in the tree of root, as
// "STATE PID": processes named as twins, and processes with no exit
// signal, which is how a twin is born (before it names itself) and what no
// program of the source's makes.
func twinsUnder(root int) []string {
	var out []string
	for _, pid := range processTreeOf(root) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		// The exit signal is the 38th field: the 36th after the name.
		unsignalled := len(rest) > 35 && rest[35] == "0"
		if strings.Contains(s, "("+lazy.TwinName+")") || unsignalled {
			out = append(out, rest[0]+" "+strconv.Itoa(pid))
		}
	}
	return out
}

// kcmp(2)'s types: the descriptor table, and the root, working directory
// and umask (fs_struct).
const (
	kcmpFiles = 2
	kcmpFS    = 3
)

// requireParkedTwins checks every live twin in the tree of root as the
// source's programs could meet it, parked: in a session of its own, with a
// descriptor table, a root and a working directory of its own (kcmp), and
// the root for its working directory. A twin that shared its process's
// fs_struct would make the process's execve() of a set-user-ID program
// run without the owner's rights (LSM_UNSAFE_SHARE). It returns how many
// twins it checked.
func requireParkedTwins(t *testing.T, root int) int {
	t.Helper()
	n := 0
	for _, tw := range twinsUnder(root) {
		state, pidText, _ := strings.Cut(tw, " ")
		pid, _ := strconv.Atoi(pidText)
		if state == "Z" || state == "X" {
			continue
		}
		st, err := procfs.ReadStat(pid)
		if err != nil {
			continue // gone since
		}
		for _, k := range []struct {
			typ  int
			what string
		}{{kcmpFiles, "descriptor table"}, {kcmpFS, "root and working directory (fs_struct)"}} {
			r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(st.PPid), uintptr(k.typ), 0, 0, 0)
			if errno == 0 && r == 0 {
				t.Errorf("twin %d shares its process %d's %s", pid, st.PPid, k.what)
			}
		}
		if sid, err := unix.Getsid(pid); err == nil && sid != pid {
			t.Errorf("twin %d is in session %d, not one of its own", pid, sid)
		}
		cwd, cerr := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		rootDir, rerr := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
		if cerr == nil && rerr == nil && cwd != rootDir {
			t.Errorf("twin %d works in %s, not in its root %s", pid, cwd, rootDir)
		}
		n++
	}
	return n
}

// The copy-on-write capture without the module (--memory twin): the source
// is held only for CRIU's metadata and a twin per process (page tables),
// and right after it runs on it rewrites every page of its memory as fast
// as it can, while its twin's pages are drained and copied into the
// sibling. The sibling has the memory of the fork instant; the source has
// its own; and once the twins are released nothing of them is left in the
// source: no process, no zombie, no SIGCHLD, its pids and memory charge as
// before.
func TestBundleForkTwinUnderWriteStorm(t *testing.T) {
	requireBundleStack(t)
	requireTwins(t)
	requireNoLeftovers(t)
	const mib = 256
	for attempt := 1; ; attempt++ {
		if twinStorm(t, mib) || attempt == 3 {
			break
		}
	}
	requireNoLeftovers(t)
}

// twinStorm is one round of TestBundleForkTwinUnderWriteStorm; false when
// the storm came too early to prove anything (a scheduling gap before the
// fork set it off), and the round must be run again.
func twinStorm(t *testing.T, mib int) bool {
	src, srcIO := memfillBundle(t, "twsrc", true, mib)
	src.start(t)
	defer src.remove(t)
	var hash string
	eventually(t, 2*time.Minute, "the source's fill", func() error {
		b, err := os.ReadFile(filepath.Join(srcIO, "source.hash"))
		hash = strings.TrimSpace(string(b))
		return err
	})
	memBefore := testCgroupFile(t, src, "memory", "memory.usage_in_bytes", "memory.current")
	if got := memfillAsk(t, srcIO, "arm 40ms", time.Minute); got != "ok" {
		t.Fatalf("arm: %q", got)
	}
	sib, sibIO := memfillBundle(t, "twsib", false, mib)
	defer sib.remove(t)
	launched := time.Now()
	r := forkBundle(t, src, sib, nil, "--memory", "twin", "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork --memory twin: exit %d: %s", r.code, r.stderr)
	}
	rep := forkReport(t, r)
	s := rep.Plan.Snapshots
	if rep.Plan.Memory != "twin" || s == nil || s.Twins == 0 || s.Twins != s.Processes {
		t.Fatalf("the plan's memory %q, snapshots %+v: want twins, one per process", rep.Plan.Memory, s)
	}
	if w := rep.Plan.Pages.PagesWritten; w*4096 > 16<<20 {
		t.Errorf("the twin dump wrote %d pages while the source was held: its memory was copied in the pause", w)
	}
	storm := strings.Fields(memfillAsk(t, srcIO, "storm", time.Minute))
	if len(storm) != 4 {
		t.Fatalf("the source's storm did not happen (%q): its pause (%.0f ms) was shorter than 40 ms?", storm, rep.SourcePauseMs)
	}
	started, _ := strconv.ParseInt(storm[0], 10, 64)
	gap, _ := strconv.ParseFloat(storm[1], 64)
	if time.Unix(0, started).Before(launched) || gap < rep.SourcePauseMs/2 {
		t.Logf("round inconclusive: the storm started at %v after a %.0f ms gap, the fork at %v with a %.0f ms pause", time.Unix(0, started), gap, launched, rep.SourcePauseMs)
		return false
	}
	if got := memfillAsk(t, sibIO, "hash", 3*time.Minute); got != hash {
		t.Fatalf("the sibling's memory hash %s, want the fork instant's %s (the source rewrote it from %v on, in %s ms)", got, hash, time.Unix(0, started), storm[2])
	}
	if got := memfillAsk(t, srcIO, "hash", time.Minute); got != storm[3] || got == hash {
		t.Fatalf("the source's hash %s after its storm, want the storm's %s", got, storm[3])
	}
	t.Logf("source pause %.0f ms; the source rewrote its %d MiB in %s ms right after; the sibling has the fork instant's memory", rep.SourcePauseMs, mib, storm[2])

	eventually(t, time.Minute, "the twins released", func() error {
		if tw := twinsOf(t, src); len(tw) > 0 {
			return errorf("the source still has twins (state pid): %v", tw)
		}
		// What the pids controller charges is the threads of the
		// processes it lists, and nothing else (a zombie stays
		// charged until it is reaped).
		charged := testCgroupFile(t, src, "pids", "pids.current", "pids.current")
		if threads := cgroupThreads(t, src); charged != threads {
			return errorf("the source's cgroup is charged %d tasks, and its processes have %d threads", charged, threads)
		}
		return nil
	})
	if n := memfillAsk(t, srcIO, "sigchld", time.Minute); n != "0" {
		t.Errorf("the source received %s SIGCHLD: its twins' ends reached it", n)
	}
	// Every page was written: the twins held the old copies until they
	// went, and now nothing does.
	if memAfter := testCgroupFile(t, src, "memory", "memory.usage_in_bytes", "memory.current"); memAfter > memBefore+memBefore/8+16<<20 {
		t.Errorf("the source's cgroup is charged %d MiB, %d MiB before the fork: its twins' memory stayed charged", memAfter>>20, memBefore>>20)
	}
	return true
}

// processTreeOf lists pid and its descendants.
func processTreeOf(pid int) []int {
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pids[i]))
		for _, task := range tasks {
			data, _ := os.ReadFile(task)
			for _, f := range strings.Fields(string(data)) {
				if c, err := strconv.Atoi(f); err == nil {
					pids = append(pids, c)
				}
			}
		}
	}
	return pids
}

// cgroupThreads counts the threads of the processes of b's cgroup.
func cgroupThreads(t *testing.T, b *bundle) int64 {
	t.Helper()
	var procs []byte
	var err error
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/pids/tclone-test", b.id, "cgroup.procs"),
		filepath.Join("/sys/fs/cgroup/tclone-test", b.id, "cgroup.procs"),
	} {
		if procs, err = os.ReadFile(p); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range strings.Fields(string(procs)) {
		tasks, _ := os.ReadDir(filepath.Join("/proc", f, "task"))
		n += int64(len(tasks))
	}
	return n
}

// twinSource is a memfill bundle of mib MiB, filled, for the refusal
// tests; limit, if set, is its cgroup's memory limit in bytes.
func twinSource(t *testing.T, role string, mib int, limit int64) (*bundle, string) {
	t.Helper()
	src, io := memfillBundle(t, role, true, mib)
	if limit > 0 {
		if src.spec.Linux.Resources == nil {
			src.spec.Linux.Resources = &specs.LinuxResources{}
		}
		src.spec.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit}
		src.save(t)
	}
	src.start(t)
	eventually(t, 2*time.Minute, "the source's fill", func() error {
		_, err := os.Stat(filepath.Join(io, "source.hash"))
		return err
	})
	return src, io
}

// What twins cannot hold is refused by --memory twin before anything is
// made, saying why, with the source running on untouched; auto takes the
// source's memory the old way instead, and says why in its log:
//   - memory fork() does not copy (MADV_DONTFORK): found in the images
//     after the dump, so auto dumps again;
//   - a cgroup without room for a copy of the source's private memory;
//   - memory registered with a userfaultfd of the source's own.
func TestBundleForkTwinRefusals(t *testing.T) {
	requireBundleStack(t)
	requireTwins(t)
	requireNoLeftovers(t)
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) (*bundle, string)
		why   string
		// auto: whether a fork with auto succeeds (CRIU cannot dump a
		// process holding a userfaultfd at all).
		auto bool
	}{
		{"dontfork", func(t *testing.T) (*bundle, string) {
			src, io := twinSource(t, "twdf", 16, 0)
			if got := memfillAsk(t, io, "dontfork 8", time.Minute); got != "ok" {
				t.Fatalf("dontfork: %q", got)
			}
			return src, io
		}, "MADV_DONTFORK", true},
		{"memory-limit", func(t *testing.T) (*bundle, string) {
			return twinSource(t, "twml", 96, 144<<20)
		}, "memory limit", true},
		{"userfaultfd", func(t *testing.T) (*bundle, string) {
			src, io := twinSource(t, "twuf", 16, 0)
			if got := memfillAsk(t, io, "uffd", time.Minute); got != "ok" {
				t.Fatalf("uffd: %q", got)
			}
			return src, io
		}, "userfaultfd", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, io := c.setup(t)
			hash := memfillAsk(t, io, "hash", time.Minute)
			sib, _ := memfillBundle(t, "twrs", false, 16)
			r := forkBundle(t, src, sib, nil, "--memory", "twin")
			if r.code == 0 || !strings.Contains(r.stderr, "--memory twin") && !strings.Contains(r.stderr, "twin capture") || !strings.Contains(r.stderr, c.why) {
				t.Fatalf("--memory twin: exit %d: %s; want a refusal naming %q", r.code, r.stderr, c.why)
			}
			if got := memfillAsk(t, io, "hash", time.Minute); got != hash {
				t.Fatalf("the refused fork changed the source's memory")
			}
			if tw := twinsOf(t, src); len(tw) > 0 {
				t.Fatalf("the refused fork left twins: %v", tw)
			}
			requireNoLeftovers(t)
			if !c.auto {
				return
			}
			sib.remove(t)
			sib, sibIO := memfillBundle(t, "twra", false, 16)
			r = runDetached(t, nil, tcloneBin(), "--debug", "fork", "--bundle", sib.dir, "--memory", "auto", "--print-stats", src.id, sib.id)
			if r.code != 0 {
				t.Fatalf("--memory auto: exit %d: %s", r.code, r.stderr)
			}
			if rep := forkReport(t, r); rep.Plan.Memory == "twin" {
				t.Fatalf("auto captured with twins a source they cannot hold")
			}
			if !strings.Contains(r.stderr, c.why) {
				t.Errorf("auto's log does not say why it took the memory the old way (%q): %s", c.why, r.stderr)
			}
			if got := memfillAsk(t, sibIO, "ping", time.Minute); got != "pong" {
				t.Fatalf("the sibling of auto answers %q", got)
			}
			requireNoLeftovers(t)
		})
	}
}

// A twin plan's lazy-pages daemon killed at a random instant of the drain
// and of three siblings' fills: memory is never wrong (each sibling is
// complete, with the fork instant's memory, or gone: the daemon's guard
// kills those still filling), the twins die with the guard's copies of
// their lifelines, and tclone gc reaps their zombies: nothing of them is
// left in the source, which runs on. (A SIGKILL of the daemon and its
// guard at once is the lazy-pages daemon's one documented gap:
// criuhooks/lazypages/doc.go.)
func TestTwinDaemonKilledWhileDraining(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	requireNoLeftovers(t)
	src, want, planDir, sibs := lazySiblings(t, "tk", 3, "20ms")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	// The plan is used up by its three siblings; its daemon's record of
	// the twins it holds says auto took twins.
	id := filepath.Base(planDir)
	if _, err := os.Stat(filepath.Join(hostStore.LazyDir(), id+".twins.json")); err != nil {
		t.Fatalf("the plan's daemon holds no twins (auto did not take them?): %v", err)
	}
	time.Sleep(time.Duration(rng.Int63n(int64(400 * time.Millisecond))))
	daemon := daemonOf(t, id)
	syscall.Kill(daemon, syscall.SIGKILL)
	t.Logf("killed the daemon, %d", daemon)
	for i, sib := range sibs {
		sibExec := func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }
		eventually(t, 30*time.Second, fmt.Sprintf("sibling %d complete or gone", i), func() error {
			if st := crunState(t, sib.id); st != "running" {
				return nil
			}
			res := sibExec(t, "/workload", "probe", "--hash")
			if res.code != 0 {
				return fmt.Errorf("probe: exit %d: %s", res.code, res.stderr)
			}
			var r report
			if err := json.Unmarshal([]byte(res.stdout), &r); err != nil {
				return err
			}
			if r.MemSHA256 != want {
				t.Fatalf("sibling %d runs with memory that is not the fork instant's: hash %s, want %s", i, r.MemSHA256, want)
			}
			return nil
		})
		run(t, time.Minute, tcloneBin(), "delete", "--force", sib.id)
	}
	if g := run(t, 2*time.Minute, tcloneBin(), "gc"); g.code != 0 {
		t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
	}
	if tw := twinsOf(t, src); len(tw) > 0 {
		t.Fatalf("tclone gc left twins in the source (state pid): %v", tw)
	}
	srcExec := func(t *testing.T, a ...string) result { return src.exec(t, rewriteWorkload(a)...) }
	if got := workloadCmd(t, srcExec, "probe", "--hash").MemSHA256; got != want {
		t.Fatalf("the source's memory changed: %s, want %s", got, want)
	}
}

// Twins are parked once the source runs again, and live on while the plan's
// daemon copies their memory out (slowly here: a pause between chunks).
// Each, as the source's programs could meet it, keeps to itself
// (requireParkedTwins); once the plan goes, so do they.
func TestTwinsParkApartFromTheirProcesses(t *testing.T) {
	requireBundleStack(t)
	requireTwins(t)
	requireNoLeftovers(t)
	src, _ := twinSource(t, "tpsrc", 64, 0)
	defer src.remove(t)
	r := runDetached(t, []string{lazy.EnvChunkPause + "=200ms"}, tcloneBin(), "--log-level", "debug", "fork", "--plan-only", "--memory", "twin", src.id)
	if r.code != 0 {
		t.Fatalf("fork --plan-only --memory twin: exit %d: %s", r.code, r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	if n := requireParkedTwins(t, crunPid(t, src.id)); n == 0 {
		removePlan(planDir)
		t.Fatal("the source has no live twin while the plan's daemon copies them")
	}
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "parked side by side once the tree ran again"; !strings.Contains(string(log), want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	removePlan(planDir)
	eventually(t, time.Minute, "the twins gone with the plan", func() error {
		if tw := twinsOf(t, src); len(tw) > 0 {
			return errorf("the source still has twins (state pid): %v", tw)
		}
		return nil
	})
	requireNoLeftovers(t)
}

// A CRIU killed while a process of the source sits at the twin plugin's
// trampoline (its twin just born) lets the process go on through it, and
// leaves the trampoline in the process's vDSO. The next twin capture of the
// source uses that place again: it once refused, the vDSO's padding being
// too short with the old trampoline in it (found by the fault suite).
// Rounds alternate with a CRIU killed while a twin, parked by its own
// calls, waits at its stop for the plugin to take its lifeline: the twin
// dies with CRIU; and with a CRIU killed while the process sits at the
// trampoline after the calls of a branch's write tracking (the plugin made
// a userfaultfd there, and closed it; TCLONE_TWIN_TRACK asks for them
// here): the close's 0, at the clone's own address, once sent the thread
// down the twin's way out, and the source lost it (found by review). And
// with a CRIU killed between that userfaultfd and its close: the process
// kept the descriptor, and its next dump failed on it (found by review).
// After each round every thread of the source is there, no process of it
// holds a userfaultfd it did not hold before, nothing of a twin is left
// once tclone gc has run, and the source runs on.
func TestTwinCaptureAfterCRIUKilledAtTheTrampoline(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid := workloadOf(t, 16)
	before := threadsOf(pid)
	uffdsBefore := userfaultfdsUnder(pid)
	// Each trampoline left used to push the next one further into the
	// padding, until none fitted: several rounds.
	for round, point := range []string{"after-clone", "parking", "uffd", "uffd-open", "after-clone", "parking", "uffd", "uffd-open", "after-clone"} {
		t.Setenv("TCLONE_TWIN_TEST_STALL", point+":20000")
		if strings.HasPrefix(point, "uffd") {
			t.Setenv(criuhooks.TwinTrackEnv, "")
		}
		cmd, criu := startStalledCapture(t, n, pid, point)
		syscall.Kill(criu, syscall.SIGKILL)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		os.Unsetenv("TCLONE_TWIN_TEST_STALL")
		os.Unsetenv(criuhooks.TwinTrackEnv)
		requireUntraced(t, pid, releaseWait)
		requireSourceRuns(t, n)
		requireThreadsLive(t, fmt.Sprintf("round %d (%s)", round, point), pid, before)
		if got := userfaultfdsUnder(pid); !maps.Equal(got, uffdsBefore) {
			t.Fatalf("round %d (%s): the source's userfaultfd descriptors (process: descriptors) after CRIU was killed: %v, before: %v", round, point, got, uffdsBefore)
		}
		// Dead before any clean-up: it died with CRIU, or ran its exit.
		eventually(t, 10*time.Second, "the twin dead with CRIU", func() error {
			for _, tw := range twinsUnder(pid) {
				if !strings.HasPrefix(tw, "Z ") {
					return fmt.Errorf("round %d (%s): a twin alive in the source: %v", round, point, tw)
				}
			}
			return nil
		})
		if r := run(t, time.Minute, tcloneBin(), "gc"); r.code != 0 {
			t.Fatalf("round %d (%s): tclone gc: %s", round, point, r.stderr)
		}
		eventually(t, 10*time.Second, "no twin left in the source", func() error {
			if tw := twinsUnder(pid); len(tw) > 0 {
				return fmt.Errorf("round %d (%s): twins in the source after tclone gc: %v", round, point, tw)
			}
			return nil
		})
	}
	r := runDetached(t, nil, tcloneBin(), "fork", "--plan-only", "--file-locks", "--memory", "twin", containerID(t, n))
	if dir := strings.TrimSpace(r.stdout); hostStore.Contains(dir) {
		defer removePlan(dir)
	}
	if r.code != 0 {
		t.Fatalf("the twin capture after the killed one: exit %d: %s", r.code, r.stderr)
	}
	requireSourceRuns(t, n)
}

// startStalledCapture starts a twin capture of container n (its process
// pid) and returns once the plugin waits at its test stall point
// (TCLONE_TWIN_TEST_STALL, which the caller sets), with the capture's
// command and its CRIU.
func startStalledCapture(t *testing.T, n string, pid int, point string) (*exec.Cmd, int) {
	t.Helper()
	return startCaptureStalledAt(t, n, pid, "twin", "test stall at "+point)
}

// startCaptureStalledAt starts a capture of container n (its process pid)
// with --memory memory, and returns once its CRIU's log says stall (the
// warning of a test stall the caller set up), with the capture's command
// and its CRIU.
func startCaptureStalledAt(t *testing.T, n string, pid int, memory, stall string) (*exec.Cmd, int) {
	t.Helper()
	// Only this capture's log: an earlier one's may be left.
	old, _ := filepath.Glob(filepath.Join(hostStore.Dir("*"), "work", "dump.log"))
	cmd, stderr, criu := startCapture(t, containerID(t, n), pid, "--memory", memory)
	eventually(t, 30*time.Second, "the capture at its test stall", func() error {
		logs, _ := filepath.Glob(filepath.Join(hostStore.Dir("*"), "work", "dump.log"))
		for _, l := range logs {
			if slices.Contains(old, l) {
				continue
			}
			if b, _ := os.ReadFile(l); strings.Contains(string(b), stall) {
				return nil
			}
		}
		return fmt.Errorf("not yet (%d capture logs): %s", len(logs), stderr.String())
	})
	return cmd, criu
}

// A twin killed before it names itself (here by a SIGKILL to it alone,
// while the plugin waits right after its clone) fails the fork, and leaves
// no zombie in its process once the fork has returned, with no tclone gc:
// the plugin names the twin in its message, and the capture reaps it.
// Such a zombie has its process's name and no exit signal, which nothing
// else tells from a child of the process's own; it stayed until the
// process ended (found by review).
func TestTwinKilledBeforeItIsNamedIsReaped(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid, cmd, _, twin := stalledAtBirth(t, "killedtwin")
	if err := syscall.Kill(twin, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the twin %d: %v", twin, err)
	}
	err := cmd.Wait()
	stderr := cmd.Stderr.(*strings.Builder).String()
	if err == nil {
		t.Fatalf("the capture succeeded with its twin killed: %s", stderr)
	}
	t.Logf("the capture failed, as it must: %s", stderr)
	if tw := twinsUnder(pid); len(tw) > 0 {
		t.Fatalf("the failed capture left twins in the source (state pid): %v", tw)
	}
	if !strings.Contains(stderr, fmt.Sprintf("twin %d", twin)) {
		t.Errorf("the capture's error does not name the twin %d", twin)
	}
	// The log it names is there: the plan's directory is gone.
	_, log, named := strings.Cut(stderr, "(full log: ")
	log, _, _ = strings.Cut(log, ")")
	if !named {
		t.Errorf("the capture's error names no log")
	} else if _, err := os.Stat(log); err != nil {
		t.Errorf("the log the capture's error names: %v", err)
	}
	requireUntraced(t, pid, releaseWait)
	if st, err := procfs.ReadStat(pid); err != nil || (st.State != 'S' && st.State != 'R') {
		t.Fatalf("the source's process after the failed capture: state %q (%v), want it running or sleeping", st.State, err)
	}
	requireTwinCaptureWorks(t, n, "the failed one")
	requireNoLeftovers(t)
}

// requireTwinCaptureWorks fails unless a twin capture of container n works
// (after the capture named by after); its plan goes at once.
func requireTwinCaptureWorks(t *testing.T, n, after string) {
	t.Helper()
	r := runDetached(t, nil, tcloneBin(), "fork", "--plan-only", "--memory", "twin", containerID(t, n))
	if dir := strings.TrimSpace(r.stdout); hostStore.Contains(dir) {
		removePlan(dir)
	}
	if r.code != 0 {
		t.Fatalf("the twin capture after %s: exit %d: %s", after, r.code, r.stderr)
	}
}

// stalledAtBirth starts a one-process source named after base (the plugin
// stalls once) and a twin capture of it that waits right after the clone,
// and returns the source's name and process, the capture's command and
// CRIU, and the twin just born.
func stalledAtBirth(t *testing.T, base string) (n string, pid int, cmd *exec.Cmd, criu, twin int) {
	t.Helper()
	n, pid = sleeper(t, base)
	t.Setenv("TCLONE_TWIN_TEST_STALL", "after-clone:20000")
	cmd, criu = startStalledCapture(t, n, pid, "after-clone")
	os.Unsetenv("TCLONE_TWIN_TEST_STALL")
	return n, pid, cmd, criu, bornTwin(t, pid)
}

// bornTwin waits for the one twin of process pid, just born, and returns it.
func bornTwin(t *testing.T, pid int) int {
	t.Helper()
	var twin int
	eventually(t, 10*time.Second, "the twin just born", func() error {
		tw := twinsUnder(pid)
		if len(tw) != 1 {
			return fmt.Errorf("the source's unsignalled children (state pid): %v, want the one twin", tw)
		}
		var err error
		twin, err = strconv.Atoi(strings.Fields(tw[0])[1])
		return err
	})
	return twin
}

// A twin killed before it names itself while its capture dies too (the
// capture's tclone, its CRIU and the twin, all killed at once while the
// plugin waits right after the clone) leaves a zombie that no message
// names, with its process's name and no exit signal. tclone gc finds it
// from the births file the plugin wrote before the clone, and reaps it; it
// stayed until its process ended (found by review). The source runs on,
// and its next capture works.
func TestTwinKilledWithItsCaptureIsReaped(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid, cmd, criu, twin := stalledAtBirth(t, "killedall")
	for _, p := range []int{cmd.Process.Pid, criu, twin} {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
			t.Fatalf("killing %d: %v", p, err)
		}
	}
	cmd.Wait()
	requireUntraced(t, pid, releaseWait)
	zombie := fmt.Sprintf("Z %d", twin)
	eventually(t, 10*time.Second, "the killed twin a zombie of its process", func() error {
		if tw := twinsUnder(pid); !slices.Equal(tw, []string{zombie}) {
			return fmt.Errorf("the source's unsignalled children (state pid): %v, want [%s]", tw, zombie)
		}
		return nil
	})
	if r := run(t, time.Minute, tcloneBin(), "gc"); r.code != 0 {
		t.Fatalf("tclone gc: %s", r.stderr)
	}
	if tw := twinsUnder(pid); len(tw) > 0 {
		t.Fatalf("the source's unsignalled children after tclone gc (state pid): %v, want none", tw)
	}
	requireRunningOn(t, pid)
	requireTwinCaptureWorks(t, n, "the killed one")
	requireNoLeftovers(t)
}

// A process's vDSO padding that holds the trampoline of another tclone
// (an older one, left by a CRIU killed while the process was at it) is
// written over: the twin capture works, says so, and leaves the padding
// zeroed. It once refused ("has 8 bytes of padding"): only this tclone's
// own trampoline was found again. Bytes there that are no trampoline of
// tclone's are left alone, and the twin capture refuses, saying why.
func TestTwinCaptureWritesOverAnOlderTrampoline(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid := sleeper(t, "oldtramp")
	site, pad := vdsoPadding(t, pid)
	// An older trampoline: code of its own (nops), to 8 bytes before the
	// vDSO's end.
	old := fakeTrampoline(len(pad)-8, bytes.Repeat([]byte{0x90}, len(pad)-40))
	writeMem(t, pid, site, old)
	log := string(planDumpLog(t, n, "twin"))
	if want := "a trampoline of another tclone left by a killed CRIU at"; !strings.Contains(log, want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	if _, pad := vdsoPadding(t, pid); slices.ContainsFunc(pad, func(b byte) bool { return b != 0 }) {
		t.Errorf("the vDSO's padding after the capture is not zeroed: % x", pad)
	}
	// Someone else's bytes: refused, and left as they are.
	junk := []byte("not tclone's")
	writeMem(t, pid, site, junk)
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--memory", "twin", containerID(t, n))
	if dir := strings.TrimSpace(r.stdout); hostStore.Contains(dir) {
		removePlan(dir)
	}
	if r.code == 0 || !strings.Contains(r.stderr, "holds bytes of someone else's") || !strings.Contains(r.stderr, "fork again, or with --memory copy or lazy") {
		t.Errorf("a twin capture with someone else's bytes where the trampoline goes: exit %d: %s", r.code, r.stderr)
	}
	if _, pad := vdsoPadding(t, pid); string(pad[:len(junk)]) != string(junk) {
		t.Errorf("the capture touched someone else's bytes in the vDSO: % x", pad[:len(junk)])
	}
	writeMem(t, pid, site, make([]byte, len(junk)))
	if r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--memory", "twin", containerID(t, n)); r.code != 0 {
		t.Errorf("the twin capture once the padding is clean: exit %d: %s", r.code, r.stderr)
	} else {
		removePlan(strings.TrimSpace(r.stdout))
	}
	requireRunningOn(t, pid)
}

// requireRunningOn fails unless process pid is running or sleeping within
// releaseWait: a plan's removal, or a recovery, reaps twins through the
// source's process, which it traces for a moment.
func requireRunningOn(t *testing.T, pid int) {
	t.Helper()
	eventually(t, releaseWait, "the source's process running on", func() error {
		if st, err := procfs.ReadStat(pid); err != nil || (st.State != 'S' && st.State != 'R') {
			return fmt.Errorf("state %q (%v), want it running or sleeping", st.State, err)
		}
		return nil
	})
}

// A thread still at a trampoline a killed CRIU left (here sent to a loop
// in it) keeps the twin capture from writing over it: the capture fails,
// saying to fork again, and the thread runs on where it was.
func TestTwinCaptureLeavesATrampolineAThreadIsAt(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid := sleeper(t, "attramp")
	site, pad := vdsoPadding(t, pid)
	// A trampoline of tclone's, with a loop 16 bytes in.
	tramp := fakeTrampoline(len(pad)-8, []byte{0xeb, 0xfe}) // jmp .
	writeMem(t, pid, site, tramp)
	spinAt(t, pid, site+16)
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--memory", "twin", containerID(t, n))
	if dir := strings.TrimSpace(r.stdout); hostStore.Contains(dir) {
		removePlan(dir)
	}
	if r.code == 0 || !strings.Contains(r.stderr, "runs the trampoline a killed CRIU left in its vDSO: fork again") ||
		!strings.Contains(r.stderr, "or with --memory copy or lazy") {
		t.Errorf("a twin capture with a thread at the trampoline: exit %d: %s", r.code, r.stderr)
	}
	if _, now := vdsoPadding(t, pid); !slices.Equal(now[:len(tramp)], tramp) {
		t.Errorf("the capture wrote over the trampoline a thread is at")
	}
	requireUntraced(t, pid, releaseWait)
	if st, err := procfs.ReadStat(pid); err != nil || st.State != 'R' {
		t.Errorf("the thread at the loop after the capture: state %q (%v), want R", st.State, err)
	}
}

// fakeTrampoline makes n bytes that the twin plugin takes for a trampoline
// of a tclone's: the clone every one starts with, code 16 bytes in, and
// the twin's name and root near the end.
func fakeTrampoline(n int, code []byte) []byte {
	b := make([]byte, n)
	copy(b, []byte{0x0f, 0x05, 0x48, 0x85, 0xc0, 0x74, 0x10}) // syscall; test %rax, %rax; jz
	copy(b[16:], code)
	copy(b[n-16:], "tclone-twin\x00/\x00")
	return b
}

// spinAt sends the one thread of process pid to addr, a loop, for good
// (the container's removal ends it).
func spinAt(t *testing.T, pid int, addr uint64) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// Every ptrace request from the thread that attached.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errc <- func() error {
			if err := unix.PtraceAttach(pid); err != nil {
				return err
			}
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
				return err
			}
			var r unix.PtraceRegs
			err := unix.PtraceGetRegs(pid, &r)
			if err == nil {
				r.Rip = addr
				r.Orig_rax = ^uint64(0) // the sleep it was in is not restarted
				err = unix.PtraceSetRegs(pid, &r)
			}
			return errors.Join(err, unix.PtraceDetach(pid))
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("sending process %d to %#x: %v", pid, addr, err)
	}
}

// sleeper starts a container named after base that runs busybox's sleep
// and nothing else, and returns its name and host PID.
func sleeper(t *testing.T, base string) (string, int) {
	t.Helper()
	n := name(t, base)
	podman(t, "run", "-d", "--name", n, busybox, "sleep", "1000")
	pid, err := strconv.Atoi(podman(t, "inspect", "--format", "{{.State.Pid}}", n))
	if err != nil {
		t.Fatal(err)
	}
	return n, pid
}

// vdsoPadding reads the vDSO of process pid and returns where tclone's
// trampoline goes (17 to 32 bytes past the image's last byte that is not
// zero, the image ending with its section headers) and the bytes from
// there to the vDSO's end.
func vdsoPadding(t *testing.T, pid int) (uint64, []byte) {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var start, end uint64
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.HasSuffix(l, "[vdso]") {
			fmt.Sscanf(l, "%x-%x", &start, &end)
		}
	}
	if end == 0 {
		t.Fatalf("process %d has no vDSO", pid)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	buf := make([]byte, end-start)
	if _, err := mem.ReadAt(buf, int64(start)); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	image := le.Uint64(buf[0x28:]) + uint64(le.Uint16(buf[0x3a:]))*uint64(le.Uint16(buf[0x3c:]))
	last := image
	for last > 0 && buf[last-1] == 0 {
		last--
	}
	off := (last + 32) &^ 15
	return start + off, buf[off:]
}

// writeMem writes b at addr in process pid's memory, read-only or not.
func writeMem(t *testing.T, pid int, addr uint64, b []byte) {
	t.Helper()
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if _, err := mem.WriteAt(b, int64(addr)); err != nil {
		t.Fatalf("writing %d bytes at %#x in process %d: %v", len(b), addr, pid, err)
	}
}

// userfaultfdsUnder gives, for every process of the tree of root that
// holds userfaultfd descriptors, their numbers.
func userfaultfdsUnder(root int) map[int]string {
	out := map[int]string{}
	for _, p := range processTreeOf(root) {
		var held []string
		for fd, l := range descriptorsOf(p) {
			if l == "anon_inode:[userfaultfd]" {
				held = append(held, fd)
			}
		}
		if len(held) > 0 {
			slices.Sort(held)
			out[p] = strings.Join(held, ",")
		}
	}
	return out
}

// requireThreadsLive fails the test (saying what) if a thread of before,
// threadsOf(root) taken earlier, is gone or has exited after CRIU was
// killed.
func requireThreadsLive(t *testing.T, what string, root int, before map[int]map[int]procfs.Stat) {
	t.Helper()
	after := threadsOf(root)
	for p, tids := range before {
		for tid := range tids {
			if st, ok := after[p][tid]; !ok || st.Exited() {
				t.Fatalf("%s: thread %d of process %d is gone after CRIU was killed (state %q)", what, tid, p, st.State)
			}
		}
	}
}

// threadsOf gives, for every process of the tree of root, its threads'
// stat lines by thread id.
func threadsOf(root int) map[int]map[int]procfs.Stat {
	out := map[int]map[int]procfs.Stat{}
	for _, p := range processTreeOf(root) {
		out[p] = map[int]procfs.Stat{}
		tids, _ := procfs.Threads(p)
		for _, tid := range tids {
			if st, err := procfs.ReadTaskStat(p, tid); err == nil {
				out[p][tid] = st
			}
		}
	}
	return out
}

// wipeOnForkPy keeps a marker in a page it marked MADV_WIPEONFORK, beside
// glibc's own such pages (its getrandom() state), and on each /tmp/go
// writes to /tmp/wf what that page holds and fresh random bytes from
// glibc's getrandom().
const wipeOnForkPy = `import ctypes, os, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
if libc.madvise(addr, 4096, 18) != 0:  # MADV_WIPEONFORK
    raise OSError(ctypes.get_errno(), "madvise")
ctypes.memmove(addr, b"marker", 6)
buf = ctypes.create_string_buffer(16)
def rnd():
    n = libc.getrandom(buf, 16, 0)
    return buf.raw[:n].hex() if n == 16 else "getrandom failed: %d" % ctypes.get_errno()
rnd()
while True:
    if os.path.exists("/tmp/go"):
        os.remove("/tmp/go")
        with open("/tmp/wf.tmp", "w") as f:
            f.write("%s %s" % (ctypes.string_at(addr, 6).hex(), rnd()))
        os.rename("/tmp/wf.tmp", "/tmp/wf")
    time.sleep(0.02)
`

// Memory fork() wipes (MADV_WIPEONFORK) does not keep a source from a twin
// fork: the sibling finds it zeroed, as a child of fork() does, and the
// source keeps it; glibc's getrandom() state, kept in such memory, is
// seeded again in the sibling.
func TestTwinForkZeroesWipeOnForkMemory(t *testing.T) {
	requireStack(t)
	src := name(t, "wipeonfork")
	podman(t, "run", "-d", "--name", src, "-e", "WFPY="+wipeOnForkPy, workspace, "bash", "-c", `exec python3 -c "$WFPY"`)
	read := func(ctr string) (page, random string) {
		t.Helper()
		out := poke(t, ctr, "/tmp/wf")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("%s: /tmp/wf holds %q", ctr, out)
		}
		return f[0], f[1]
	}
	marker := hex.EncodeToString([]byte("marker"))
	if page, _ := read(src); page != marker {
		t.Fatalf("the source's page holds %s before the fork", page)
	}
	sib := src + "-f"
	r := run(t, 3*time.Minute, podmanForkBin(), "--memory", "twin", "--wait-memory", "--name", sib, src)
	if r.code != 0 {
		t.Fatalf("fork --memory twin: exit %d: %s", r.code, r.stderr)
	}
	srcPage, srcRand := read(src)
	sibPage, sibRand := read(sib)
	if srcPage != marker {
		t.Errorf("the source's page holds %s after the fork, want %s", srcPage, marker)
	}
	if sibPage != strings.Repeat("0", len(marker)) {
		t.Errorf("the sibling's page holds %s, want zeros", sibPage)
	}
	// Where glibc keeps its getrandom() state in wiped memory (kernels with
	// the vDSO's getrandom, 6.11 and later), this is that state seeded
	// again in the sibling; elsewhere every call asks the kernel.
	if len(srcRand) != 32 || len(sibRand) != 32 || srcRand == sibRand {
		t.Errorf("getrandom() after the fork: source %s, sibling %s", srcRand, sibRand)
	}
}
