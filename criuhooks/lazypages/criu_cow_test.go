package lazypages

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
)

// The copy-on-write capture, with raw CRIU and the vma_cherrypick module:
// lazypagesd -dump makes a --lazy-pages dump of a running memfill with a
// snapshot of each process taken in post-dump, and serves restores from
// the snapshots. Hosts without the module skip these tests, or fail them
// under TCLONE_REQUIRE_MODULE=1 (the VM test, make vm-test, sets it: it
// loads the module and runs them there).

func requireModule(t *testing.T) {
	t.Helper()
	v, err := cherrypick.Probe()
	if err == nil && !v.Has(cherrypick.FeatureSnapshot) {
		err = fmt.Errorf("the loaded module has no snapshots (features %#x)", uint64(v.Features))
	}
	if err != nil {
		if os.Getenv("TCLONE_REQUIRE_MODULE") == "1" {
			t.Fatalf("copy-on-write test cannot run: %v", err)
		}
		t.Skipf("copy-on-write test skipped: %v (TCLONE_REQUIRE_MODULE=1 makes this a failure)", err)
	}
}

// cowDumpOf starts lazypagesd dumping src copy-on-write into a fresh images
// directory and serving restores at work's socket; it returns the daemon
// and its "dumped" report.
func (e *criuEnv) cowDumpOf(t *testing.T, src memProc, name string, pause time.Duration) (*daemonProc, string, string, daemonLine) {
	t.Helper()
	images := filepath.Join(e.scratch, "images-"+name)
	work := filepath.Join(e.scratch, "work-"+name)
	os.MkdirAll(images, 0o755)
	os.MkdirAll(work, 0o755)
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, pause,
		"-dump", strconv.Itoa(src.pid), "-criu", e.criu)
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
	const mib, children = 256, 2
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
	if st.PagesWritten*pageSize > uint64(mib)<<20/16 {
		t.Fatalf("the lazy dump wrote %d pages to its images: the filled memory should be left to the snapshots", st.PagesWritten)
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
