package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/memuse"
	"github.com/tclone/tclone/runtime/plan"
)

// cowSource starts a workload holding mib MiB in a bare bundle, and
// returns it with its memory hash and an exec of its workload.
func cowSource(t *testing.T, prefix string, mib int) (*bundle, string, execer) {
	t.Helper()
	bin := t.TempDir()
	copyWorkload(t, bin)
	src := newBundle(t, prefix+"src", true, "/opt/wl/workload", "serve", "--mem-mib", strconv.Itoa(mib))
	src.spec.Mounts = append(src.spec.Mounts, mountBind("/opt/wl", bin))
	src.save(t)
	src.start(t)
	ex := func(t *testing.T, a ...string) result { return src.exec(t, rewriteWorkload(a)...) }
	hash := workloadCmd(t, ex, "probe", "--hash").MemSHA256
	if hash == "" {
		t.Fatal("the source's workload reports no memory hash")
	}
	return src, hash, ex
}

// cowSibling is an empty bundle for a sibling of a cowSource.
func cowSibling(t *testing.T, src *bundle, name string) (*bundle, execer) {
	t.Helper()
	bin := t.TempDir()
	copyWorkload(t, bin)
	sib := newBundle(t, name, false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.spec.Mounts = append(sib.spec.Mounts, mountBind("/opt/wl", bin))
	sib.save(t)
	return sib, func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }
}

// cowLoaded says whether vma_cherrypick is loaded with snapshots. Under
// TCLONE_REQUIRE_MODULE=1 (the kernel VM) it must be.
func cowLoaded(t *testing.T) bool {
	t.Helper()
	v, err := cherrypick.Probe()
	ok := err == nil && v.Has(cherrypick.FeatureSnapshot)
	if !ok && os.Getenv("TCLONE_REQUIRE_MODULE") == "1" {
		t.Fatalf("vma_cherrypick with snapshots is required here: %v (features %#x)", err, uint64(v.Features))
	}
	return ok
}

// cowRunning checks the workload source runs: thawed, and answering.
func cowRunning(t *testing.T, src *bundle, ex execer) {
	t.Helper()
	if s := freezerState(t, src); s != "THAWED" {
		t.Fatalf("source %s is %s", src.id, s)
	}
	workloadCmd(t, ex, "probe")
}

// snapshotHolders lists the processes that hold a vma_cherrypick snapshot.
func snapshotHolders() []int {
	var pids []int
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && strings.Contains(link, "vma_cherrypick-snapshot") {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			pids = append(pids, pid)
		}
	}
	return pids
}

func requireNoSnapshots(t *testing.T) {
	t.Helper()
	eventually(t, 15*time.Second, "snapshots released", func() error {
		if h := snapshotHolders(); len(h) > 0 {
			return errorf("processes %v still hold snapshots", h)
		}
		return nil
	})
}

// A copy-on-write fork (--memory cow). Without the vma_cherrypick module
// it is refused, saying why and what to do, with nothing made, and auto
// falls back. With the module (the kernel VM's stack stage): the plan
// holds one snapshot per process instead of page images; the source
// rewrites its memory after the fork, and each sibling still gets the
// memory of the fork instant, mapping the source's pages (PSS well under
// RSS) or, with --memory lazy, copies; a sibling's writes reach no one
// else; and the snapshots are released when the plan is used up.
func TestBundleForkCow(t *testing.T) {
	requireBundleStack(t)
	requireNoLeftovers(t)
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	src, hash0, srcExec := cowSource(t, "cow", 24)
	step("source up")

	if !cowLoaded(t) {
		r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--memory", "cow", src.id)
		if r.code == 0 || !strings.Contains(r.stderr, "--memory cow") || !strings.Contains(r.stderr, "load the vma_cherrypick module") {
			t.Fatalf("--memory cow without the module: exit %d %q", r.code, r.stderr)
		}
		cowRunning(t, src, srcExec)
		requireNoLeftovers(t)
		r = run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--memory", "auto", src.id)
		if r.code != 0 {
			t.Fatalf("--memory auto without the module: exit %d %s", r.code, r.stderr)
		}
		dir := strings.TrimSpace(r.stdout)
		defer removePlan(dir)
		p, err := plan.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		if p.Memory == "cow" || p.Snapshots != nil {
			t.Fatalf("--memory auto without the module made a copy-on-write plan: %+v", p)
		}
		return
	}

	r := run(t, 2*time.Minute, tcloneBin(), "fork", "--plan-only", "--file-locks", "--memory", "cow", "--uses", "2", src.id)
	if r.code != 0 {
		t.Fatalf("fork --memory cow: exit %d: %s", r.code, r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	p, err := plan.Read(planDir)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Snapshots
	if p.Memory != "cow" || s == nil || s.Processes < 1 || s.AnonPages < 24<<20/4096 || s.HolderPid <= 0 {
		t.Fatalf("the plan's memory: %q, snapshots %+v; want cow with the 24 MiB held", p.Memory, s)
	}
	if syscall.Kill(s.HolderPid, 0) != nil {
		t.Fatalf("the snapshots' holder %d does not run", s.HolderPid)
	}
	if p.Pages.PagesWritten*4096 > 16<<20 {
		t.Errorf("the copy-on-write dump wrote %d pages: the memory was copied", p.Pages.PagesWritten)
	}
	t.Logf("pause %.0f ms, snapshots %.1f ms, %d pages written", p.Timings.SourcePauseMs, s.TookMs, p.Pages.PagesWritten)
	// The module cannot go while a plan holds its snapshots.
	if out, err := exec.Command("rmmod", "vma_cherrypick").CombinedOutput(); err == nil {
		t.Fatalf("rmmod vma_cherrypick succeeded while a plan holds snapshots: %s", out)
	}
	step("captured")
	mutated := workloadCmd(t, srcExec, "mutate", "--tag", "after-fork", "--mem")
	if mutated.MemSHA256 == hash0 {
		t.Fatal("the source's memory did not change")
	}

	// The first sibling shares the snapshots' pages.
	sib, sibExec := cowSibling(t, src, "cowsib")
	res := runDetached(t, nil, tcloneBin(), "restore", "--detach", "--print-stats", "--image-path", planDir, "--bundle", sib.dir, sib.id)
	if res.code != 0 {
		t.Fatalf("restore of a copy-on-write plan: exit %d: %s", res.code, res.stderr)
	}
	step("first sibling restored")
	var m fork.Materialized
	if err := json.Unmarshal([]byte(res.stdout), &m); err != nil {
		t.Fatalf("--print-stats: %v: %q", err, res.stdout)
	}
	if m.Memory != "cow" || m.Share == nil || m.Share.Error != "" || m.Share.Areas == 0 || m.Share.Refused != 0 {
		t.Fatalf("the sibling's memory %q, share %+v: want every area shared", m.Memory, m.Share)
	}
	if got := workloadCmd(t, sibExec, "probe", "--hash").MemSHA256; got != hash0 {
		t.Fatalf("the sibling's memory hash %s, want the fork instant's %s", got, hash0)
	}
	step("first sibling's hash")
	st, err := memuse.Tree(crunPid(t, sib.id))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sibling RSS %d KiB, PSS %d KiB", st.RssKiB, st.PssKiB)
	if st.PssKiB*100 > st.RssKiB*55 {
		t.Errorf("sibling PSS %d KiB over 0.55 × RSS %d KiB: its pages are not shared", st.PssKiB, st.RssKiB)
	}
	step("first sibling's PSS")
	if got := workloadCmd(t, sibExec, "mutate", "--tag", "sibling", "--mem").MemSHA256; got == hash0 {
		t.Fatal("the sibling's memory did not change")
	}
	if got := workloadCmd(t, srcExec, "probe", "--hash").MemSHA256; got != mutated.MemSHA256 {
		t.Fatalf("a sibling's write reached the source: hash %s, want %s", got, mutated.MemSHA256)
	}

	step("first sibling checked")
	// The second gets copies, and the plan is used up.
	sib2, sib2Exec := cowSibling(t, src, "cowsib")
	res = runDetached(t, nil, tcloneBin(), "restore", "--detach", "--memory", "lazy", "--image-path", planDir, "--bundle", sib2.dir, sib2.id)
	if res.code != 0 {
		t.Fatalf("restore --memory lazy of a copy-on-write plan: exit %d: %s", res.code, res.stderr)
	}
	if got := workloadCmd(t, sib2Exec, "probe", "--hash").MemSHA256; got != hash0 {
		t.Fatalf("the second sibling's memory hash %s, want the fork instant's %s", got, hash0)
	}
	step("second sibling checked")
	requireNoSnapshots(t)
	step("snapshots released")
	g := run(t, time.Minute, tcloneBin(), "gc")
	if g.code != 0 || strings.Contains(g.stdout, "snapshots_held") {
		t.Fatalf("tclone gc after the plan was used up: exit %d %s %s", g.code, g.stdout, g.stderr)
	}
	cowRunning(t, src, srcExec)
	requireNoLeftovers(t)
}

// kill -9 of tclone in a copy-on-write fork, while CRIU holds the source
// with its snapshots taken, and once the plan's daemon holds them: the
// source runs on, and after tclone gc no snapshot, plan or daemon is left.
func TestBundleForkCowKilled(t *testing.T) {
	requireBundleStack(t)
	if !cowLoaded(t) {
		t.Skip("needs the vma_cherrypick module: the kernel VM's stack stage runs it (TestBundleForkCow checks the refusal here)")
	}
	requireNoLeftovers(t)
	src, _, srcExec := cowSource(t, "cowk", 16)
	for _, point := range []string{fork.CrashSnapshotTaken, fork.CrashSnapshotsHeld} {
		sib, _ := cowSibling(t, src, "cowksib")
		r := forkBundle(t, src, sib, []string{fork.EnvCrashAt + "=" + point}, "--file-locks", "--memory", "cow")
		if r.code != 128+9 {
			t.Fatalf("tclone was not killed at %s: exit %d, stderr %q", point, r.code, r.stderr)
		}
		cowRunning(t, src, srcExec)
		if g := run(t, time.Minute, tcloneBin(), "gc"); g.code != 0 {
			t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
		}
		requireNoSnapshots(t)
		requireNoLeftovers(t)
		if st := crunState(t, sib.id); st != "" {
			t.Fatalf("%s: sibling %s still known to crun (%s)", point, sib.id, st)
		}
	}
}
