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
	"github.com/tclone/tclone/test/testenv"
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
// falls back to twins. With the module (the kernel VM's stack stage): the plan
// holds one snapshot per process instead of page images; the source
// rewrites its memory after the fork, and each sibling still gets the
// memory of the fork instant, mapping the source's pages (PSS well under
// RSS) or, with --memory lazy, copies; a sibling's writes reach no one
// else; and the snapshots are released when the plan is used up. Then the
// same source forked with --memory copy: page images and unshared pages.
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
		// Without the module, auto takes twins (tclone's CRIU plugin is
		// installed wherever the stack is: see twin_test.go).
		if p.Memory != "twin" || p.Snapshots == nil || p.Snapshots.Twins != p.Snapshots.Processes {
			t.Fatalf("--memory auto without the module made a %q plan (snapshots %+v), want one held by twins", p.Memory, p.Snapshots)
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
	// The workload's 24 MiB are the source's pages: none is the sibling's
	// alone (a copying fork's sibling owns them all, below).
	cowOwn := processUse(t, crunPid(t, sib.id)).PrivateDirtyKiB
	if cowOwn > 12<<10 {
		t.Errorf("the sibling owns %d KiB of dirty memory: its 24 MiB were copied", cowOwn)
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

	// The same source forked with --memory copy, beside the copy-on-write
	// fork: page images, no snapshots, and a sibling whose pages are its own.
	sib3, sib3Exec := cowSibling(t, src, "copysib")
	res = forkBundle(t, src, sib3, nil, "--file-locks", "--memory", "copy", "--print-stats")
	if res.code != 0 {
		t.Fatalf("fork --memory copy: exit %d: %s", res.code, res.stderr)
	}
	rep := forkReport(t, res)
	if rep.Plan.Memory == "cow" || rep.Plan.Snapshots != nil || rep.Sibling.Memory != "copy" || rep.Plan.Pages.PagesWritten < 24<<20/4096 {
		t.Fatalf("--memory copy: plan memory %q, snapshots %+v, sibling %q, %d pages written; want page images of the 24 MiB",
			rep.Plan.Memory, rep.Plan.Snapshots, rep.Sibling.Memory, rep.Plan.Pages.PagesWritten)
	}
	if got := workloadCmd(t, sib3Exec, "probe", "--hash").MemSHA256; got != mutated.MemSHA256 {
		t.Fatalf("the copying fork's sibling has memory hash %s, want the source's %s", got, mutated.MemSHA256)
	}
	copyOwn := processUse(t, crunPid(t, sib3.id)).PrivateDirtyKiB
	t.Logf("pages written: copy-on-write %d, copy %d; the sibling's own dirty memory: copy-on-write %d KiB, copy %d KiB",
		p.Pages.PagesWritten, rep.Plan.Pages.PagesWritten, cowOwn, copyOwn)
	if copyOwn < 23<<10 {
		t.Errorf("the copying fork's sibling owns %d KiB of dirty memory: its 24 MiB are shared", copyOwn)
	}
	step("copying fork checked")
	cowRunning(t, src, srcExec)
	requireNoLeftovers(t)
}

// kill -9 of tclone in a copy-on-write fork, while CRIU holds the source
// with its snapshots taken, and once the plan's daemon holds them: the
// source runs on, and after tclone gc no snapshot, plan or daemon is left.
func TestBundleForkCowKilled(t *testing.T) {
	requireBundleStack(t)
	if !cowLoaded(t) {
		testenv.InVM(t, "stack", "needs the vma_cherrypick module (TestBundleForkCow checks the refusal here)")
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

// forkReport is what tclone fork --print-stats printed: the plan and the
// sibling.
func forkReport(t *testing.T, r result) fork.Report {
	t.Helper()
	var rep fork.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Plan == nil || rep.Sibling == nil {
		t.Fatalf("--print-stats: %v: %q", err, r.stdout)
	}
	return rep
}

// processUse is the memory process pid maps, alone.
func processUse(t *testing.T, pid int) memuse.Usage {
	t.Helper()
	u, err := memuse.Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// memfillBin is the CRIU tests' memory filler (test/cmd/memfill), which the
// kernel VM's stack stage puts beside tclone.
func memfillBin() string { return filepath.Join(binDir(), "memfill") }

// memfillAsk leaves a request for the memfill running as pid 1 of a
// container whose /io is dir, and returns its answer.
func memfillAsk(t *testing.T, dir, request string, timeout time.Duration) string {
	t.Helper()
	resp := filepath.Join(dir, "1.resp")
	os.Remove(resp)
	tmp := filepath.Join(dir, "req.tmp")
	if err := os.WriteFile(tmp, []byte(request), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "1.req")); err != nil {
		t.Fatal(err)
	}
	var answer string
	eventually(t, timeout, "memfill's answer to "+request, func() error {
		b, err := os.ReadFile(resp)
		if err != nil {
			return err
		}
		answer = strings.TrimSpace(string(b))
		return nil
	})
	if strings.HasPrefix(answer, "error:") {
		t.Fatalf("memfill %s: %s", request, answer)
	}
	return answer
}

// memfillBundle is a bundle running memfill over mib MiB, answering through
// its own directory, mounted read-write at /io.
func memfillBundle(t *testing.T, role string, populate bool, mib int) (*bundle, string) {
	t.Helper()
	bin, io := t.TempDir(), t.TempDir()
	copyBinary(t, memfillBin(), bin)
	b := newBundle(t, role, populate, "/opt/mf/memfill", "-mib", strconv.Itoa(mib), "-dir", "/io")
	b.spec.Mounts = append(b.spec.Mounts, mountBind("/opt/mf", bin),
		specsMount{Destination: "/io", Source: io, Type: "bind", Options: []string{"rbind", "rw"}})
	b.save(t)
	return b, io
}

// A copy-on-write fork of a 1 GiB source (the kernel VM's stack stage): the
// sibling answers with the fork instant's memory, mapping the source's
// pages, so that its PSS and the source's are about a half of their RSS or
// less. The source's pause is logged beside fork(2) of the same process in
// the same VM, and the time the snapshots took: figures, not bounds (make
// kernel-bench has them with repetitions).
func TestBundleForkCowGiB(t *testing.T) {
	requireBundleStack(t)
	if !cowLoaded(t) {
		testenv.InVM(t, "stack", "needs the vma_cherrypick module")
	}
	if _, err := os.Stat(memfillBin()); err != nil {
		t.Fatalf("memfill: %v (the kernel VM's stack stage puts it in TCLONE_BINDIR)", err)
	}
	requireNoLeftovers(t)
	const mib = 1024
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	src, srcIO := memfillBundle(t, "gibsrc", true, mib)
	src.start(t)
	var hash string
	eventually(t, 5*time.Minute, "the source's fill", func() error {
		b, err := os.ReadFile(filepath.Join(srcIO, "source.hash"))
		hash = strings.TrimSpace(string(b))
		return err
	})
	step("source filled")
	forkNs, err := strconv.ParseInt(memfillAsk(t, srcIO, "forktime", time.Minute), 10, 64)
	if err != nil {
		t.Fatalf("forktime: %v", err)
	}
	sib, sibIO := memfillBundle(t, "gibsib", false, mib)
	r := forkBundle(t, src, sib, nil, "--memory", "cow", "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork --memory cow of %d MiB: exit %d: %s", mib, r.code, r.stderr)
	}
	step("forked")
	rep := forkReport(t, r)
	s, sh := rep.Plan.Snapshots, rep.Sibling.Share
	if rep.Plan.Memory != "cow" || s == nil || s.AnonPages < mib<<20/4096 {
		t.Fatalf("the plan's memory %q, snapshots %+v: want cow holding the %d MiB", rep.Plan.Memory, s, mib)
	}
	if sh == nil || sh.Error != "" || sh.Areas == 0 || sh.Refused != 0 {
		t.Fatalf("the sibling's share %+v: want every area shared", sh)
	}
	if w := rep.Plan.Pages.PagesWritten; w*4096 > 16<<20 {
		t.Errorf("the copy-on-write dump wrote %d pages: the memory was copied", w)
	}
	if got := memfillAsk(t, sibIO, "hash", 3*time.Minute); got != hash {
		t.Fatalf("the sibling's memory hash %s, want the source's %s", got, hash)
	}
	step("sibling's hash")
	for _, b := range []*bundle{src, sib} {
		st, err := memuse.Tree(crunPid(t, b.id))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: RSS %d KiB, PSS %d KiB (%.2f)", b.id, st.RssKiB, st.PssKiB, float64(st.PssKiB)/float64(st.RssKiB))
		if st.RssKiB < mib<<10 || st.PssKiB*100 > st.RssKiB*55 {
			t.Errorf("%s: PSS %d KiB of RSS %d KiB: want at least %d MiB resident, PSS at most 0.55 of it", b.id, st.PssKiB, st.RssKiB, mib)
		}
	}
	t.Logf("TIMING %d MiB: source pause %.0f ms (snapshots %.1f ms, %d pages written by CRIU); fork(2) of the same process %.1f ms",
		mib, rep.SourcePauseMs, s.TookMs, rep.Plan.Pages.PagesWritten, float64(forkNs)/1e6)
	if got := memfillAsk(t, srcIO, "ping", time.Minute); got != "pong" {
		t.Fatalf("the source answers %q after the fork", got)
	}
	sib.remove(t)
	src.remove(t)
	requireNoSnapshots(t)
	requireNoLeftovers(t)
}
