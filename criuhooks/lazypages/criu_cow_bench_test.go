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
// process, the time from the restore's start to the sibling's first answer,
// and the sibling's PSS over RSS once its pages are shared. One process,
// one round per size (-benchtime 1x); make kernel-bench runs it in the VM.
func BenchmarkCRIUCow(b *testing.B) {
	for _, mib := range []int{1, 1024} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			for range b.N {
				cowRound(b, mib)
			}
		})
	}
}

func cowRound(b *testing.B, mib int) {
	requireModule(b)
	e := requireCRIU(b)
	src, want := e.startSource(b, mib, 0)
	forkNs, err := src.ask("forktime", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	gap := func() float64 {
		g, err := src.ask("gap", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		us, _ := strconv.ParseFloat(g, 64)
		return us / 1000
	}
	gap()
	copyImages := filepath.Join(e.scratch, "bench-copy")
	os.MkdirAll(copyImages, 0o755)
	if out, err := criuCommand(e.criu, "dump", "-t", strconv.Itoa(src.pid), "-D", copyImages,
		"--leave-running", "-o", "dump.log").CombinedOutput(); err != nil {
		b.Fatalf("criu dump: %v: %s", err, out)
	}
	copyPause := gap()
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
	hook := e.shareHook(b, ctl, "")
	start := time.Now()
	sib, err := e.restore(images, work, true, "--action-script", hook)
	if err != nil {
		b.Fatal(err)
	}
	defer sib.kill()
	if _, err := sib.ask("ping", time.Minute); err != nil {
		b.Fatal(err)
	}
	first := time.Since(start)
	if got, err := sib.ask("hash", 2*time.Minute); err != nil || got != want {
		b.Fatalf("sibling: hash %q, %v; want %q", got, err, want)
	}
	rss, pss := areaUse(b, sib.pid, checkChildren(b, sib, want))
	fork, _ := strconv.ParseFloat(forkNs, 64)
	b.ReportMetric(cowPause, "cow-pause-ms")
	b.ReportMetric(copyPause, "copy-pause-ms")
	b.ReportMetric(fork/1e6, "fork-ms")
	b.ReportMetric(float64(first.Microseconds())/1000, "first-answer-ms")
	b.ReportMetric(float64(pss)/float64(rss), "pss/rss")
	d.cmd.Process.Kill()
}
