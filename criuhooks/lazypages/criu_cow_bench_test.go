package lazypages

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkCRIUCow measures, at each size, what issue-level targets are
// about: the source's pause across a copy-on-write dump and across a
// copying one (the longest wait of its 1 ms loop), fork(2) of the same
// process, the time from the restore's start to the sibling's first answer
// for each memory mode (copy: CRIU restores every page first; lazy: the
// daemon serves the copying dump's images; cow: the snapshots' pages are
// shared at pre-resume), and the copy-on-write sibling's PSS over RSS. One
// process, one round per size (-benchtime 1x); then the pause's growth
// with the number of processes. make kernel-bench runs it in the VM.
func BenchmarkCRIUCow(b *testing.B) {
	for _, mib := range []int{1, 1024} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			for range b.N {
				cowRound(b, mib)
			}
		})
	}
	b.Run("slope", func(b *testing.B) {
		for range b.N {
			cowSlope(b)
		}
	})
}

// cowSlope is the copy-on-write pause of a 1 MiB process alone and with 15
// children, per extra process.
func cowSlope(b *testing.B) {
	requireModule(b)
	e := requireCRIU(b)
	const children = 15
	var pauses [2]float64
	for i, n := range []int{0, children} {
		src, _ := e.startSource(b, 1, n)
		pauses[i] = cowPause(b, e, src, fmt.Sprintf("slope-%d", n))
		src.kill()
	}
	b.ReportMetric(pauses[0], "cow-pause-1-ms")
	b.ReportMetric(pauses[1], fmt.Sprintf("cow-pause-%d-ms", children+1))
	b.ReportMetric((pauses[1]-pauses[0])/children, "slope-ms/proc")
}

// cowPause is the source's longest wait across a copy-on-write dump.
func cowPause(b *testing.B, e *criuEnv, src memProc, name string) float64 {
	gap := sourceGap(b, src)
	images := filepath.Join(e.scratch, name)
	os.MkdirAll(images, 0o755)
	defer os.RemoveAll(images)
	gap()
	d := e.startDaemon(b, images, nil, 0, "-dump", strconv.Itoa(src.pid), "-criu", e.criu)
	defer d.cmd.Process.Kill()
	return gap()
}

// sourceGap returns a function that reads, and resets, the source's
// longest wait in its 1 ms loop.
func sourceGap(b *testing.B, src memProc) func() float64 {
	return func() float64 {
		g, err := src.ask("gap", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		us, _ := strconv.ParseFloat(g, 64)
		return us / 1000
	}
}

// firstAnswer restores a sibling from images and times the restore's
// start to its first answer; with verify, it then checks the sibling's
// memory (a whole hash of 1 GiB takes minutes under TCG: the copy and lazy
// restores, which the CRIU stage's tests check, are timed only). The
// caller kills it.
func firstAnswer(b *testing.B, e *criuEnv, images, work string, lazy, verify bool, want string, extra ...string) (memProc, time.Duration) {
	start := time.Now()
	sib, err := e.restore(images, work, lazy, extra...)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := sib.ask("ping", time.Minute); err != nil {
		sib.kill()
		b.Fatal(err)
	}
	took := time.Since(start)
	if !verify {
		return sib, took
	}
	if got, err := sib.ask("hash", 5*time.Minute); err != nil || got != want {
		sib.kill()
		b.Fatalf("sibling: hash %q, %v; want %q", got, err, want)
	}
	return sib, took
}

func cowRound(b *testing.B, mib int) {
	requireModule(b)
	e := requireCRIU(b)
	src, want := e.startSource(b, mib, 0)
	forkNs, err := src.ask("forktime", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	gap := sourceGap(b, src)
	gap()
	copyImages := filepath.Join(e.scratch, "bench-copy")
	os.MkdirAll(copyImages, 0o755)
	if out, err := criuCommand(e.criu, "dump", "-t", strconv.Itoa(src.pid), "-D", copyImages,
		"--leave-running", "-o", "dump.log").CombinedOutput(); err != nil {
		b.Fatalf("criu dump: %v: %s", err, out)
	}
	copyPause := gap()
	sib, copyFirst := firstAnswer(b, e, copyImages, filepath.Join(e.scratch, "bench-copy-work"), false, false, want)
	sib.kill()
	lazyWork := filepath.Join(e.scratch, "bench-lazy-work")
	os.MkdirAll(lazyWork, 0o755)
	ld := e.startDaemon(b, copyImages, []string{filepath.Join(lazyWork, SocketName)}, 0)
	sib, lazyFirst := firstAnswer(b, e, copyImages, lazyWork, true, false, want)
	sib.kill()
	ld.cmd.Process.Kill()
	os.RemoveAll(copyImages)

	ctl := filepath.Join(e.scratch, "bench.sock")
	images := filepath.Join(e.scratch, "bench-cow")
	work := filepath.Join(e.scratch, "bench-work")
	os.MkdirAll(images, 0o755)
	os.MkdirAll(work, 0o755)
	gap()
	d := e.startDaemon(b, images, []string{filepath.Join(work, SocketName)}, 0, "-dump", strconv.Itoa(src.pid), "-criu", e.criu,
		"-share-wait", "60s", "-control", ctl)
	cowPause := gap()
	sib, first := firstAnswer(b, e, images, work, true, true, want, "--action-script", e.shareHook(b, ctl, ""))
	defer sib.kill()
	rss, pss := areaUse(b, sib.pid, checkChildren(b, sib, want))
	fork, _ := strconv.ParseFloat(forkNs, 64)
	b.ReportMetric(cowPause, "cow-pause-ms")
	b.ReportMetric(copyPause, "copy-pause-ms")
	b.ReportMetric(fork/1e6, "fork-ms")
	b.ReportMetric(float64(first.Microseconds())/1000, "cow-first-answer-ms")
	b.ReportMetric(float64(lazyFirst.Microseconds())/1000, "lazy-first-answer-ms")
	b.ReportMetric(float64(copyFirst.Microseconds())/1000, "copy-first-answer-ms")
	b.ReportMetric(float64(pss)/float64(rss), "pss/rss")
	d.cmd.Process.Kill()
}
