package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

// ThroughputResult is the source's speed right after its fork: a source
// that rewrites its memory as fast as it can (holder serve --write) is
// forked, and the pages it writes per 10 ms before and after the pause
// show what the capture costs it once it runs again. With --memory twin a
// first write of a page its twin still shares copies the page, and the
// twins' drain takes CPU; with --memory copy the pages were copied inside
// the pause. An idle source (no writes) shows how long its twins hold its
// pages after the thaw.
type ThroughputResult struct {
	Workload string  `json:"workload"`
	MemMiB   int     `json:"mem_mib"`
	WindowS  float64 `json:"window_s"`
	// Runs are the write-heavy source's forks, by memory mode.
	Runs []ThroughputRun `json:"runs"`
	// Idle are the idle source's twin forks.
	Idle []IdleTwinRun `json:"idle"`
}

// ThroughputRun is one fork of the write-heavy source.
type ThroughputRun struct {
	Memory string `json:"memory"`
	Rep    int    `json:"rep"`
	// PauseMs is the pause tclone reported; StallMs the writer's longest
	// stop around the fork (its longest bucket), which contains it.
	PauseMs float64 `json:"pause_ms"`
	StallMs float64 `json:"stall_ms"`
	// BaselineMiBs is the median speed of the writer's buckets in the
	// second before the fork, MiB/s.
	BaselineMiBs float64 `json:"baseline_mib_s"`
	// Shares are the writer's speed in each 100 ms from the thaw (the end
	// of its longest bucket), as a share of the baseline.
	Shares []float64 `json:"shares"`
	// RecoveredMs is when, from the thaw, the first 100 ms at 0.9 of the
	// baseline or more began (-1: not within the window).
	RecoveredMs float64 `json:"recovered_ms"`
	// MeanShare is the writer's mean speed over that time as a share of the
	// baseline (1 when it recovered in the first 100 ms), and LostMs the
	// work it did not do meanwhile, in ms of writing at the baseline.
	MeanShare float64 `json:"mean_share"`
	LostMs    float64 `json:"lost_ms"`
	// TwinsGoneMs is when, from the thaw, the source had no twin left
	// (twin forks only; -1: still there at the end of the window).
	TwinsGoneMs float64 `json:"twins_gone_ms,omitempty"`

	thawNs int64 // the thaw, Unix ns
}

// IdleTwinRun is one twin fork of the idle source: its twins were seen
// from FirstSeen to LastSeen (polled every 5 ms), and the pause holds the
// start of that, so the twins outlived the thaw by between LifeMs−PauseMs
// and LifeMs.
type IdleTwinRun struct {
	Rep     int     `json:"rep"`
	PauseMs float64 `json:"pause_ms"`
	LifeMs  float64 `json:"life_ms"`
}

// throughputMemories are the memory modes the write-heavy source is forked
// with, in order.
var throughputMemories = []string{"twin", "copy"}

// throughputRecovered is the share of the baseline speed that counts as
// full speed again, allowing for the noise of a shared host.
const throughputRecovered = 0.9

func (b *Bench) runThroughput(ctx context.Context) *ThroughputResult {
	mib, reps := b.cfg.ThroughputMemMiB, b.cfg.ThroughputReps
	tr := &ThroughputResult{MemMiB: mib, WindowS: b.cfg.ThroughputWindow.Seconds(),
		Workload: fmt.Sprintf("one holder process touching %d MiB of private anonymous memory; the write-heavy one rewrites all of it, page after page, round and round (holder serve --write), the idle one does not write", mib)}
	prefix := fmt.Sprintf("tcb-%s-tput", b.runID)

	w := holderWorkload(1, mib, "holder")
	w.Name = fmt.Sprintf("write-%d", mib)
	w.Cmd = append(w.Cmd, "--write")
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.removeContainers(prefix + "-src")
		b.fail(w.Name, MethodTclone, -1, fmt.Errorf("starting the write-heavy source: %w", err))
		return tr
	}
	var ref float64
	for _, memory := range throughputMemories {
		for rep := 0; rep < reps && ctx.Err() == nil; rep++ {
			sib := fmt.Sprintf("%s-%s-%d", prefix, memory, rep)
			run, err := b.throughputOnce(ctx, src, sib, memory, &ref)
			b.removeContainers(sib)
			if err != nil {
				b.fail(w.Name, MethodTclone+" --memory "+memory, rep, err)
				continue
			}
			run.Rep = rep
			tr.Runs = append(tr.Runs, *run)
		}
	}
	b.removeContainers(src.Name)

	w = holderWorkload(1, mib, "holder")
	w.Name = fmt.Sprintf("idle-%d", mib)
	src, err = b.startSource(ctx, w, prefix+"-idle", "tclone")
	if err != nil {
		b.removeContainers(prefix + "-idle")
		b.fail(w.Name, MethodTcloneTwin, -1, fmt.Errorf("starting the idle source: %w", err))
		return tr
	}
	for rep := 0; rep < reps && ctx.Err() == nil; rep++ {
		sib := fmt.Sprintf("%s-idle-%d", prefix, rep)
		b.track(sib)
		watch := watchTwins(src.InitPid)
		st, _, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, memory: "twin", stats: true})
		first, last, gone := watch.stop(ctx, b.cfg.ThroughputWindow)
		b.removeContainers(sib)
		switch {
		case err != nil:
			b.fail(w.Name, MethodTcloneTwin, rep, err)
		case first == 0:
			b.fail(w.Name, MethodTcloneTwin, rep, fmt.Errorf("no twin of the source was seen during its twin fork"))
		case !gone:
			b.fail(w.Name, MethodTcloneTwin, rep, fmt.Errorf("the source still had twins %s after its twin fork began", b.cfg.ThroughputWindow))
		default:
			tr.Idle = append(tr.Idle, IdleTwinRun{Rep: rep, PauseMs: st.SourcePauseMs, LifeMs: float64(last-first) / 1e6})
		}
	}
	b.removeContainers(src.Name)
	return tr
}

// throughputOnce forks the write-heavy source src once into sib and reads
// what its writer did from a second before the fork to the end of the
// window after the fork returned. ref is the first fork's baseline speed
// (0 before it): a fork waits, up to 10 s, for the writer to be back at
// 0.9 of it, so that a fork after one the writer had not got over yet
// does not start from a lowered baseline.
func (b *Bench) throughputOnce(ctx context.Context, src *Source, sib, memory string, ref *float64) (*ThroughputRun, error) {
	var before []holderreport.WriteBucket
	for try := 0; try < 10; try++ {
		if _, err := src.Holder.poke(ctx); err != nil {
			return nil, err
		}
		sleepCtx(ctx, time.Second)
		rep, err := src.Holder.poke(ctx)
		if err != nil {
			return nil, err
		}
		before = rep.Writes
		speed := medianSpeed(before)
		if *ref == 0 {
			*ref = speed
		}
		if speed >= throughputRecovered**ref {
			break
		}
	}
	forkAt := time.Now().UnixNano()
	b.track(sib)
	var watch *twinWatch
	if memory == "twin" {
		watch = watchTwins(src.InitPid)
		defer watch.stop(ctx, 0)
	}
	st, _, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, memory: memory, stats: true})
	if err != nil {
		return nil, err
	}
	sleepCtx(ctx, b.cfg.ThroughputWindow)
	rep, err := src.Holder.poke(ctx)
	if err != nil {
		return nil, err
	}
	run, err := analyzeWrites(append(before, rep.Writes...), forkAt, st.SourcePauseMs, b.cfg.ThroughputWindow)
	if err != nil {
		return nil, err
	}
	run.Memory, run.PauseMs = memory, st.SourcePauseMs
	if watch != nil {
		_, last, gone := watch.stop(ctx, 0)
		run.TwinsGoneMs = -1
		if gone {
			run.TwinsGoneMs = math.Max(0, float64(last-run.thawNs)/1e6)
		}
	}
	return run, nil
}

// bucketSpeed is what the writer wrote in bk, MiB/s.
func bucketSpeed(bk holderreport.WriteBucket) float64 {
	return float64(bk.Pages) * 4096 / (1 << 20) / (float64(bk.EndNs-bk.StartNs) / 1e9)
}

// medianSpeed is the median of the buckets' speeds, MiB/s (0: none).
func medianSpeed(buckets []holderreport.WriteBucket) float64 {
	var v []float64
	for _, bk := range buckets {
		if bk.EndNs > bk.StartNs {
			v = append(v, bucketSpeed(bk))
		}
	}
	return summarize(v).Median
}

// analyzeWrites reads a writer's buckets around a fork that began at
// forkAt (Unix ns) and paused the source pauseMs (0: not known): the
// baseline before it, the stop, and the speed after the thaw, over
// window. The stop is the bucket after forkAt whose length is nearest the
// pause (the longest, the pause not known): on a shared host the writer
// may be kept from running longer than that before or after it.
func analyzeWrites(buckets []holderreport.WriteBucket, forkAt int64, pauseMs float64, window time.Duration) (*ThroughputRun, error) {
	var before []float64
	stall := -1
	off := func(i int) float64 {
		d := float64(buckets[i].EndNs-buckets[i].StartNs) / 1e6
		if pauseMs > 0 {
			return -math.Abs(d - pauseMs)
		}
		return d
	}
	for i, bk := range buckets {
		if bk.EndNs <= bk.StartNs {
			return nil, fmt.Errorf("writer bucket %d ends before it starts", i)
		}
		if bk.EndNs <= forkAt {
			before = append(before, bucketSpeed(bk))
		} else if stall < 0 || off(i) > off(stall) {
			stall = i
		}
	}
	if len(before) < 10 || stall < 0 {
		return nil, fmt.Errorf("the writer reported %d buckets before the fork and %d after: its baseline or its stop is missing", len(before), len(buckets)-len(before))
	}
	run := &ThroughputRun{BaselineMiBs: summarize(before).Median, RecoveredMs: -1,
		StallMs: float64(buckets[stall].EndNs-buckets[stall].StartNs) / 1e6}
	if run.BaselineMiBs <= 0 {
		return nil, fmt.Errorf("the writer wrote nothing in the second before the fork")
	}
	thaw := buckets[stall].EndNs
	run.thawNs = thaw
	// 100 ms slots from the thaw, up to the window or the last bucket;
	// each bucket's pages and time are shared out over the slots it
	// overlaps, in proportion.
	const slot = int64(100 * time.Millisecond)
	last := buckets[len(buckets)-1].EndNs
	n := int(min(int64(window), last-thaw) / slot)
	pages, spans := make([]float64, n), make([]float64, n)
	for _, bk := range buckets[stall+1:] {
		for k := int((bk.StartNs - thaw) / slot); k < n && thaw+int64(k)*slot < bk.EndNs; k++ {
			lo, hi := max(bk.StartNs, thaw+int64(k)*slot), min(bk.EndNs, thaw+int64(k+1)*slot)
			if hi <= lo {
				continue
			}
			part := float64(hi-lo) / float64(bk.EndNs-bk.StartNs)
			pages[k] += part * float64(bk.Pages)
			spans[k] += float64(hi - lo)
		}
	}
	var written, spent float64
	for k := 0; k < n; k++ {
		share := 0.0
		if spans[k] > 0 {
			share = pages[k] * 4096 / (1 << 20) / (spans[k] / 1e9) / run.BaselineMiBs
		}
		run.Shares = append(run.Shares, share)
		if run.RecoveredMs < 0 {
			if share >= throughputRecovered {
				run.RecoveredMs = float64(k) * 100
			} else {
				written += pages[k]
				spent += spans[k]
			}
		}
	}
	run.MeanShare = 1
	if spent > 0 {
		run.MeanShare = written * 4096 / (1 << 20) / (spent / 1e9) / run.BaselineMiBs
	}
	// Not recovered: what was lost in the window, at least.
	run.LostMs = spent / 1e6 * (1 - run.MeanShare)
	return run, nil
}

// twinWatch polls a source's PID namespace for twins.
type twinWatch struct {
	done        chan struct{}
	once        sync.Once
	wg          sync.WaitGroup
	mu          sync.Mutex
	first, last int64 // Unix ns a twin was first and last seen (0: never)
	seen        bool  // a twin was there at the last poll
}

func watchTwins(init int) *twinWatch {
	w := &twinWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			now := time.Now().UnixNano()
			has := hasTwin(init)
			w.mu.Lock()
			w.seen = has
			if has {
				if w.first == 0 {
					w.first = now
				}
				w.last = now
			}
			w.mu.Unlock()
			select {
			case <-w.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

// stop waits up to wait for the twins seen to be gone, stops the watch, and
// returns when they were first and last seen and whether they are gone. A
// second call only reads them again.
func (w *twinWatch) stop(ctx context.Context, wait time.Duration) (first, last int64, gone bool) {
	deadline := time.Now().Add(wait)
	for {
		w.mu.Lock()
		seen := w.seen
		w.mu.Unlock()
		if !seen || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	w.once.Do(func() { close(w.done) })
	w.wg.Wait()
	return w.first, w.last, w.first != 0 && !w.seen
}

// twinComm is the name twins go by (runtime/lazy's TwinName; importing that
// package would register CRIU's stats messages a second time, next to
// go-criu's).
const twinComm = "tclone-twin"

// hasTwin tells whether the one-process source init has a twin: a live
// child of it by the twins' name. (A twin is a child of the process it
// twins; reading init's children, not all of /proc, keeps the poll from
// taking the CPU the source is measured on.)
func hasTwin(init int) bool {
	for _, c := range procfs.Children(init) {
		if st, err := procfs.ReadStat(c); err == nil && st.Comm == twinComm && !st.Exited() {
			return true
		}
	}
	return false
}

// writeThroughput writes the section on the source's speed after its fork.
func writeThroughput(r *Results, p func(string, ...any)) {
	tr := r.Throughput
	if tr == nil {
		return
	}
	p("## Source speed after the fork\n\nSource: %s. Per fork, a second of writing was read as the baseline, then `podman container fork --print-stats` ran (it returns once the sibling's memory is complete) and the writer was read %.0f s later. The writer counts the pages it rewrites in each 10 ms; the *stall* is its longest stop, which holds the pause, and the thaw is its end. *Back to 0.9* is when, from the thaw, the first 100 ms at 0.9 of the baseline speed or more began; *speed meanwhile* the mean speed until then, as a share of the baseline; *lost* the writing not done meanwhile, in ms at the baseline speed. *Twins gone* is when, from the thaw, the source had no twin left (polled every 5 ms). This host is shared and has 2 CPUs: what the fork's restore and the twins' drain run after the thaw takes CPU from the source too.\n\n",
		tr.Workload, tr.WindowS)
	p("| memory | rep | pause | stall | baseline (MiB/s) | back to 0.9 | speed meanwhile | lost | twins gone | speed per 500 ms from the thaw |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, run := range tr.Runs {
		back, lost := "not in the window", "≥ "+fmtMs(run.LostMs)
		if run.RecoveredMs >= 0 {
			back, lost = fmtMs(run.RecoveredMs), fmtMs(run.LostMs)
		}
		gone := "–"
		switch {
		case run.Memory != "twin":
		case run.TwinsGoneMs < 0:
			gone = "not in the window"
		default:
			gone = fmtMs(run.TwinsGoneMs)
		}
		var shares []string
		for i := 0; i < len(run.Shares); i += 5 {
			shares = append(shares, fmt.Sprintf("%.2f", mean(run.Shares[i:min(i+5, len(run.Shares))])))
		}
		p("| %s | %d | %s | %s | %.0f | %s | %.2f | %s | %s | %s |\n", run.Memory, run.Rep, fmtMs(run.PauseMs), fmtMs(run.StallMs), run.BaselineMiBs,
			back, run.MeanShare, lost, gone, strings.Join(shares, " "))
	}
	if len(tr.Idle) > 0 {
		p("\nThe idle source's twin forks: its twins lived from their first sighting to the last; the pause holds their start, so they outlived the thaw by between *life − pause* and *life*. Until they are gone a first write of a page copies it; after, a write costs what a write after any fork() costs.\n\n| rep | pause | twins' life |\n| ---: | ---: | ---: |\n")
		for _, run := range tr.Idle {
			p("| %d | %s | %s |\n", run.Rep, fmtMs(run.PauseMs), fmtMs(run.LifeMs))
		}
	}
	p("\n")
}

// throughputTarget reports the write-heavy source's recovery after a twin
// fork. The issue sets no bound: it asks for the figures.
func throughputTarget(r *Results) Target {
	t := Target{Key: "twin_source_throughput_after_thaw", Title: "the source's throughput after the thaw, " + methodTitles[MethodTcloneTwin] + ": ms from the thaw until its writes run at 0.9 of full speed",
		BoundText: "none: report it", Value: math.NaN(), Difference: true}
	tr := r.Throughput
	if tr == nil {
		t.Detail = "not run"
		judge(&t, false)
		return t
	}
	byMemory := map[string][]ThroughputRun{}
	for _, run := range tr.Runs {
		byMemory[run.Memory] = append(byMemory[run.Memory], run)
	}
	twin := byMemory["twin"]
	if len(twin) == 0 {
		t.Detail = "no twin fork of the write-heavy source was measured"
		judge(&t, false)
		return t
	}
	med := func(runs []ThroughputRun, f func(ThroughputRun) float64) float64 {
		var v []float64
		for _, run := range runs {
			v = append(v, f(run))
		}
		return summarize(v).Median
	}
	// A run that did not recover counts as just over the window.
	window := tr.WindowS * 1000
	recovered := func(run ThroughputRun) float64 {
		if run.RecoveredMs < 0 {
			return window + 1
		}
		return run.RecoveredMs
	}
	t.Value = med(twin, recovered)
	parts := []string{}
	for _, memory := range throughputMemories {
		runs := byMemory[memory]
		if len(runs) == 0 {
			continue
		}
		back := med(runs, recovered)
		backText := fmtMs(back) + " ms"
		if back > window {
			backText = fmt.Sprintf("more than the %.0f s window", tr.WindowS)
		}
		parts = append(parts, fmt.Sprintf("--memory %s: back to 0.9 after %s, at %.2f of full speed meanwhile (%s ms of writing lost), pause %s ms (medians of %d)",
			memory, backText, med(runs, func(r ThroughputRun) float64 { return r.MeanShare }), fmtMs(med(runs, func(r ThroughputRun) float64 { return r.LostMs })),
			fmtMs(med(runs, func(r ThroughputRun) float64 { return r.PauseMs })), len(runs)))
	}
	if len(tr.Idle) > 0 {
		parts = append(parts, fmt.Sprintf("an idle source's twins lived %s ms (median of %d, pause included)", fmtMs(summarize(idleLives(tr)).Median), len(tr.Idle)))
	}
	if fr := r.ForkRef; fr != nil && fr.RewriteMs > 0 {
		parts = append(parts, fmt.Sprintf("after a plain fork() of %s, rewriting it all took %s ms against %s ms (the fork() reference)", sizeText(fr.MemMiB), fmtMs(fr.RewriteAfterForkMs), fmtMs(fr.RewriteMs)))
	}
	t.Detail = fmt.Sprintf("%s source writing all its memory: ", sizeText(tr.MemMiB)) + strings.Join(parts, "; ")
	if t.Value > window {
		t.Value = window
		t.Detail = fmt.Sprintf("at least %.0f ms: ", t.Value) + t.Detail
	}
	judge(&t, tr.MemMiB == 1024)
	return t
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

func idleLives(tr *ThroughputResult) []float64 {
	var v []float64
	for _, run := range tr.Idle {
		v = append(v, run.LifeMs)
	}
	return v
}

// validateThroughput checks a run that asked for the throughput
// experiment: every fork measured, each with a baseline and a thaw.
func validateThroughput(r *Results) []string {
	if r.Config.ThroughputMemMiB <= 0 {
		return nil
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	tr := r.Throughput
	if tr == nil {
		return []string{"throughput: not run"}
	}
	for _, memory := range throughputMemories {
		n := 0
		for _, run := range tr.Runs {
			if run.Memory != memory {
				continue
			}
			n++
			if run.BaselineMiBs <= 0 || run.StallMs <= 0 || len(run.Shares) == 0 {
				bad("throughput: --memory %s rep %d has no baseline, stall or speeds after the thaw", memory, run.Rep)
			}
		}
		if n != r.Config.ThroughputReps {
			bad("throughput: %d forks with --memory %s measured, want %d", n, memory, r.Config.ThroughputReps)
		}
	}
	if len(tr.Idle) != r.Config.ThroughputReps {
		bad("throughput: %d idle twin forks measured, want %d", len(tr.Idle), r.Config.ThroughputReps)
	}
	return problems
}
