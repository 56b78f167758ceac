package lazypages

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/kernel/cherrypick"
	"github.com/tclone/tclone/test/testenv"
)

// The copy-on-write capture, with raw CRIU and the vma_cherrypick module:
// lazypagesd -dump makes a --lazy-pages dump of a running memfill with a
// snapshot of each process taken in post-dump, and serves restores from
// the snapshots. Hosts without the module skip these tests, or fail them
// under TCLONE_REQUIRE_MODULE=1 (the VM test, make vm-test, sets it: it
// loads the module and runs them there).

func requireModule(t testing.TB) {
	t.Helper()
	v, err := cherrypick.Probe()
	if err == nil && !v.Has(cherrypick.FeatureSnapshot) {
		err = fmt.Errorf("the loaded module has no snapshots (features %#x)", uint64(v.Features))
	}
	if err != nil {
		if os.Getenv("TCLONE_REQUIRE_MODULE") == "1" {
			t.Fatalf("copy-on-write test cannot run: %v", err)
		}
		testenv.InVM(t, "CRIU", fmt.Sprintf("needs the vma_cherrypick module with snapshots (%v)", err))
	}
}

// cowDumpOf starts lazypagesd dumping src copy-on-write into a fresh images
// directory and serving restores at work's socket; it returns the daemon
// and its "dumped" report.
func (e *criuEnv) cowDumpOf(t testing.TB, src memProc, name string, pause time.Duration, more ...string) (*daemonProc, string, string, daemonLine) {
	t.Helper()
	images := filepath.Join(e.scratch, "images-"+name)
	work := filepath.Join(e.scratch, "work-"+name)
	os.MkdirAll(images, 0o755)
	os.MkdirAll(work, 0o755)
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, pause,
		append([]string{"-dump", strconv.Itoa(src.pid), "-criu", e.criu}, more...)...)
	dumped := d.find("dumped")
	if len(dumped) != 1 || dumped[0].Dump == nil {
		t.Fatalf("lazypagesd -dump reported %+v, want one dumped line", dumped)
	}
	return d, images, work, dumped[0]
}

// TestCRIUCowRestore: the source's memory as it was at the dump reaches
// two siblings restored after the source rewrote all of it, the second
// after the source is gone; the dump wrote almost no pages, and the
// source's pause is logged beside fork(2)'s.
func TestCRIUCowRestore(t *testing.T) {
	requireModule(t)
	e := requireCRIU(t)
	const mib, children = 128, 2
	src, want := e.startSource(t, mib, children)
	forkNs, err := src.ask("forktime", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.ask("gap", 30*time.Second); err != nil { // resets it
		t.Fatal(err)
	}
	d, images, work, dumped := e.cowDumpOf(t, src, "cow", 0)
	st := dumped.Dump
	gapAnswer, err := src.ask("gap", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gapUs, _ := strconv.ParseInt(gapAnswer, 10, 64)
	if st.Processes != 1+children {
		t.Fatalf("the capture saw %d processes, want %d", st.Processes, 1+children)
	}
	// Each process holds a copy of the memory (the children share theirs
	// with the root, copy-on-write, as the snapshots do).
	if st.SnapshotPages < uint64(mib)<<20/pageSize {
		t.Fatalf("snapshots hold %d pages, want at least the %d MiB filled", st.SnapshotPages, mib)
	}
	// What CRIU still wrote is a cost, not a matter of correctness (the
	// sibling's memory, checked below, is), and it varies: one lazy dump
	// in five on 7.3 wrote one process's filled memory (66 644 pages) for
	// reasons not found yet. Shown, with CRIU's own account, not checked.
	if st.PagesWritten*pageSize > uint64(mib)<<20/16 {
		t.Logf("the lazy dump wrote %d pages to its images:\n%s",
			st.PagesWritten, logLines(filepath.Join(images, "dump.log"), "Pagemap generated", "lazy"))
	}

	// The source runs on and changes every word.
	rewritten, err := src.ask("rewrite", 60*time.Second)
	if err != nil || rewritten == want {
		t.Fatalf("source rewrite: %q, %v (hash before %q)", rewritten, err, want)
	}

	sib, err := e.restore(images, work, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sib.kill()
	done := d.wait(t, EventComplete, 1, 120*time.Second)[0]
	if got, err := sib.ask("hash", 60*time.Second); err != nil || got != want {
		t.Fatalf("sibling: hash %q, %v; the source had %q at the dump (and %q after)", got, err, want, rewritten)
	}
	if done.Stats.LazyBytes < uint64(mib)<<20 {
		t.Fatalf("the sibling had %d lazy bytes, want the %d MiB filled", done.Stats.LazyBytes, mib)
	}
	checkChildren(t, sib, want)

	// The snapshots need no source: a second sibling after it is gone.
	src.kill()
	for !gone(src.pid) {
		time.Sleep(time.Millisecond)
	}
	work2 := filepath.Join(e.scratch, "work-cow2")
	os.MkdirAll(work2, 0o755)
	if err := os.Symlink(filepath.Join(work, SocketName), filepath.Join(work2, SocketName)); err != nil {
		t.Fatal(err)
	}
	sib2, err := e.restore(images, work2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sib2.kill()
	d.wait(t, EventComplete, 2, 120*time.Second)
	if got, err := sib2.ask("hash", 60*time.Second); err != nil || got != want {
		t.Fatalf("second sibling, source gone: hash %q, %v; want %q", got, err, want)
	}

	// What the source felt: the longest its request loop waited across
	// the dump. A figure to read beside fork()'s, not a bound: the VM is
	// emulated and shared (make bench measures the pause).
	fork, _ := strconv.ParseInt(forkNs, 10, 64)
	t.Logf("TIMING %d MiB, %d processes: source's longest wait across the copy-on-write dump %.1f ms (snapshots %.1f ms, %d pages written by CRIU), fork() %.1f ms",
		mib, 1+children, float64(gapUs)/1000, st.SnapshotMs, st.PagesWritten, float64(fork)/1e6)
}

// TestCRIUCowShare: with sharing asked for at pre-resume (lazypagesd
// -hook-share as CRIU's action script), the siblings' lazy areas get the
// snapshots' pages themselves: nearly nothing is copied, the memory is the
// source's at the dump, and the sibling's pages are mapped by others too
// (its PSS is a fraction of its RSS).
func TestCRIUCowShare(t *testing.T) {
	requireModule(t)
	e := requireCRIU(t)
	const mib, children = 128, 2
	src, want := e.startSource(t, mib, children)
	ctl := filepath.Join(e.scratch, "control.sock")
	d, images, work, _ := e.cowDumpOf(t, src, "share", 0, "-share-wait", "60s", "-control", ctl)
	if _, err := src.ask("rewrite", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	hook := e.shareHook(t, ctl, "")
	sib, err := e.restore(images, work, true, "--action-script", hook)
	if err != nil {
		t.Fatal(err)
	}
	defer sib.kill()
	shared := d.wait(t, EventShared, 1, 60*time.Second)[0]
	if shared.Error != "" || shared.Share == nil {
		t.Fatalf("share: %+v", shared)
	}
	sh := shared.Share
	// Every task's filled area, unless CRIU wrote one eagerly (see
	// TestCRIUCowRestore): then that task had nothing lazy to share.
	if sh.Tasks != 1+children || sh.Bytes < uint64(mib)<<20 {
		t.Fatalf("shared %+v: want the %d MiB area of the %d tasks", sh, mib, 1+children)
	}
	if got, err := sib.ask("hash", 60*time.Second); err != nil || got != want {
		t.Fatalf("sibling: hash %q, %v; want %q", got, err, want)
	}
	done := d.wait(t, EventComplete, 1, 120*time.Second)[0]
	st := done.Stats
	if copied := (st.FaultPages + st.BackgroundPages) * pageSize; copied > uint64(mib)<<20/16 {
		t.Fatalf("%d bytes still copied with sharing on: %+v", copied, st)
	}
	addr := checkChildren(t, sib, want)
	var rss, pss uint64
	for _, pid := range append([]int{sib.pid}, childrenOf(sib.pid)...) {
		r, p := areaUse(t, pid, addr)
		rss, pss = rss+r, pss+p
	}
	t.Logf("PSS %d MiB area of the sibling's %d tasks: Rss %d kB, Pss %d kB (%.2f); %d areas shared, %d refused (%s), %d pages copied",
		mib, 1+children, rss, pss, float64(pss)/float64(rss), sh.Areas, sh.Refused, sh.Reason, st.FaultPages+st.BackgroundPages)
	if rss < uint64(1+children)*mib<<10 || pss*100 > rss*55 {
		t.Fatalf("the sibling's areas: Rss %d kB, Pss %d kB: their pages are not shared", rss, pss)
	}
	// Shared, copy-on-write: the sibling writes, and the snapshot (read by
	// a second sibling) keeps the pages as they were.
	if got, err := sib.ask("rewrite", 60*time.Second); err != nil || got == want {
		t.Fatalf("sibling rewrite: %q, %v", got, err)
	}
	work2 := filepath.Join(e.scratch, "work-share2")
	os.MkdirAll(work2, 0o755)
	if err := os.Symlink(filepath.Join(work, SocketName), filepath.Join(work2, SocketName)); err != nil {
		t.Fatal(err)
	}
	sib2, err := e.restore(images, work2, true, "--action-script", hook)
	if err != nil {
		t.Fatal(err)
	}
	defer sib2.kill()
	d.wait(t, EventComplete, 2, 120*time.Second)
	if got, err := sib2.ask("hash", 60*time.Second); err != nil || got != want {
		t.Fatalf("second sibling, after the first rewrote its shared pages: hash %q, %v; want %q", got, err, want)
	}
}

// areaUse is the Rss and Pss, in kB, of the VMA of pid that starts at addr.
func areaUse(t testing.TB, pid int, addr uint64) (rss, pss uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, _, ok := strings.Cut(f[0], "-"); ok && len(f) >= 5 {
			start, err := strconv.ParseUint(lo, 16, 64)
			in = err == nil && start == addr
			continue
		}
		if !in || len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss = n
		case "Pss:":
			pss = n
		}
	}
	if rss == 0 {
		t.Fatalf("pid %d has no resident area at %#x", pid, addr)
	}
	return rss, pss
}

// logLines are the lines of a CRIU log that mention one of words.
func logLines(path string, words ...string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > 200 {
		out = out[len(out)-200:]
	}
	return strings.Join(out, "\n")
}

// checkChildren checks that every child of a restored memfill has the
// source's memory, and returns where that memory is.
func checkChildren(t testing.TB, sib memProc, want string) uint64 {
	t.Helper()
	where, err := os.ReadFile(filepath.Join(sib.dir, "source.where"))
	if err != nil {
		t.Fatal(err)
	}
	var addr, size int64
	if n, err := fmt.Sscanf(string(where), "%d %d", &addr, &size); n != 2 {
		t.Fatalf("source.where = %q: %v", where, err)
	}
	for _, pid := range childrenOf(sib.pid) {
		if got := hashMem(t, pid, addr, size); got != want {
			t.Errorf("sibling's child %d: hash %s, want %s", pid, got, want)
		}
	}
	return uint64(addr)
}

// TestCRIUCowDaemonKilledWhileSharing: the daemon is killed (SIGKILL)
// while it shares, with an area unregistered from its task's userfaultfd
// and not yet given its pages: the one moment a task could read zeros where
// the source had data. Its guard must kill the sibling's tasks (CRIU holds
// them stopped, so none ever ran), the restore must fail, and nothing of
// the sibling, the daemon or its guard may be left.
func TestCRIUCowDaemonKilledWhileSharing(t *testing.T) {
	requireModule(t)
	e := requireCRIU(t)
	src, _ := e.startSource(t, 64, 1)
	ctl := filepath.Join(e.scratch, "control.sock")
	d, images, work, _ := e.cowDumpOf(t, src, "killed", 0, "-share-wait", "60s", "-control", ctl, "-share-pause", "3s")
	guard := childrenOf(d.cmd.Process.Pid)
	marker := filepath.Join(work, "sharing")
	cmd, result := e.restoreAtPreResume(t, images, work, e.shareHook(t, ctl, marker), marker)
	defer cmd.Process.Kill()
	// Inside the 3 s the first area spends unregistered.
	time.Sleep(time.Second)
	tasks := processesOf(filepath.Join(e.bin, "memfill"))
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	select {
	case err := <-result:
		if err == nil {
			t.Fatal("the restore succeeded although its daemon was killed while sharing")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("CRIU did not return in 30 s after the daemon was killed while sharing")
	}
	var restored []int
	for _, pid := range tasks {
		if pid != src.pid && !isChildOf(pid, src.pid) {
			restored = append(restored, pid)
		}
	}
	if len(restored) != 2 {
		t.Fatalf("found restored tasks %v while the daemon shared, want the root and its child", restored)
	}
	for _, pid := range restored {
		waitGone(t, pid, "a restored task")
	}
	for _, g := range guard {
		waitGone(t, g, "the daemon's guard")
	}
	if b, _ := os.ReadFile(filepath.Join(work, "stderr")); len(b) > 0 {
		t.Fatalf("a restored task wrote (it ran): %s", b)
	}
}

// isChildOf reports whether pid's parent is parent.
func isChildOf(pid, parent int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 1 && f[1] == strconv.Itoa(parent)
}

// TestCRIULazyDumpEndsAtOnce: criuhooks.LazyDump on this host's CRIU, no
// module needed: the --lazy-pages dump returns without any page server
// client, the source runs on, and the images hold the memory's pagemap
// (every filled page lazy) but not its pages.
func TestCRIULazyDumpEndsAtOnce(t *testing.T) {
	e := requireCRIU(t)
	const mib = 64
	src, want := e.startSource(t, mib, 1)
	images := filepath.Join(e.scratch, "lazy-dump")
	os.MkdirAll(images, 0o755)
	dir, err := os.Open(images)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	opts := &rpc.CriuOpts{
		ImagesDirFd:  proto.Int32(int32(dir.Fd())),
		Pid:          proto.Int32(int32(src.pid)),
		LeaveRunning: proto.Bool(true),
		LogFile:      proto.String("dump.log"),
		LogLevel:     proto.Int32(4),
	}
	release, err := criuhooks.LazyDump(opts, images, false)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = criuhooks.Dump(context.Background(), criuhooks.Request{CriuPath: e.criu, Opts: opts,
		LogPath: filepath.Join(images, "dump.log"), Timeout: time.Minute}, &criuhooks.CaptureHooks{})
	release()
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if _, err := os.Stat(filepath.Join(images, "tclone-dump.conf")); !os.IsNotExist(err) {
		t.Errorf("the lazy dump's configuration file is left: %v", err)
	}
	if got, err := src.ask("hash", 30*time.Second); err != nil || got != want {
		t.Fatalf("source after the dump: %q, %v", got, err)
	}
	written, err := PagesBytes(images)
	if err != nil {
		t.Fatal(err)
	}
	lazy := uint64(0)
	for _, pm := range mustGlob(t, filepath.Join(images, "pagemap-*.img")) {
		var pid int32
		fmt.Sscanf(filepath.Base(pm), "pagemap-%d.img", &pid)
		task, err := loadTaskImage(images, pid, true)
		if err != nil {
			t.Fatal(err)
		}
		lazy += task.bytes
	}
	t.Logf("lazy dump of %d MiB x 2 processes: %s, %d bytes written, %d bytes lazy", mib, took, written, lazy)
	if lazy < 2*mib<<20 {
		t.Fatalf("only %d bytes are lazy in the images, want the %d MiB of each process\n%s", lazy, mib,
			logLines(filepath.Join(images, "dump.log"), "Pagemap generated"))
	}
	if written > mib<<20/16 {
		t.Errorf("the lazy dump wrote %d bytes of pages\n%s", written, logLines(filepath.Join(images, "dump.log"), "Pagemap generated"))
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		t.Fatalf("no %s: %v", pattern, err)
	}
	return m
}

// shareHook writes the action script a restore gives CRIU to have the
// daemon at ctl share at pre-resume (CRIU runs it without a shell, so it is
// a file). With a marker, it first touches it.
func (e *criuEnv) shareHook(t testing.TB, ctl, marker string) string {
	t.Helper()
	touch := ""
	if marker != "" {
		touch = fmt.Sprintf("[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-resume ] && touch %s\n", marker)
	}
	hook := filepath.Join(e.scratch, "share-hook.sh")
	script := fmt.Sprintf("#!/bin/sh\n%sexec %s -hook-share %s\n", touch, filepath.Join(e.bin, "lazypagesd"), ctl)
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return hook
}
