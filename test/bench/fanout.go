package main

import (
	"context"
	"fmt"
	"strconv"
)

// runFanOut forks one source into 1, 4 and 16 siblings (one capture each
// time) and derives the marginal cost of an extra sibling.
func (b *Bench) runFanOut(ctx context.Context) *FanOutResult {
	w := memWorkload(b.cfg.FanOutMemMiB, b.cfg.MemProcs)
	w.Name = "fanout-" + w.Name
	fr := &FanOutResult{Workload: w.Name + ": " + w.Description, MarginalPairs: map[string]float64{}}
	prefix := fmt.Sprintf("tcb-%s-fan", b.runID)
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.fail(w.Name, MethodTclone, -1, fmt.Errorf("starting the fan-out source: %w", err))
		b.removeContainers(prefix + "-src")
		fr.Failures++
		return fr
	}
	defer b.removeContainers(src.Name)

	// One discarded fork first, so that every measured fork is warm.
	if _, sib, err := b.fanOutOnce(ctx, src, prefix+"-warmup", 1); err != nil {
		b.fail(w.Name, MethodTclone, -1, fmt.Errorf("fan-out warm-up fork: %w", err))
		b.removeContainers(sib...)
	} else {
		b.removeContainers(sib...)
	}
	for _, n := range b.cfg.FanOutCounts {
		fc := &FanOutCount{Count: n}
		fr.Counts = append(fr.Counts, fc)
		for rep := 0; rep < b.cfg.FanOutReps && ctx.Err() == nil; rep++ {
			b.logf("  fan-out %d rep %d/%d", n, rep+1, b.cfg.FanOutReps)
			s, sibs, err := b.fanOutOnce(ctx, src, fmt.Sprintf("%s%d-r%d", prefix, n, rep), n)
			b.removeContainers(sibs...)
			if err != nil {
				b.fail(w.Name, fmt.Sprintf("%s --count %d", MethodTclone, n), rep, err)
				fr.Failures++
				continue
			}
			s.Rep = rep
			fc.Samples = append(fc.Samples, s)
		}
		vals := map[string][]float64{}
		for _, s := range fc.Samples {
			for k, v := range s.Metrics {
				vals[k] = append(vals[k], v)
			}
		}
		fc.Summary = summarizeAll(vals)
	}
	var xs, ys []float64
	var base float64
	for _, fc := range fr.Counts {
		for _, s := range fc.Samples {
			xs = append(xs, float64(fc.Count))
			ys = append(ys, s.Metrics["to_running_ms"])
		}
		if fc.Count == 1 {
			base = fc.Summary["to_running_ms"].Median
		}
	}
	if sl := slope(xs, ys); sl == sl { // not NaN
		fr.MarginalMsPerChild = sl
	}
	for _, fc := range fr.Counts {
		if fc.Count > 1 && base > 0 && fc.Summary["to_running_ms"].N > 0 {
			fr.MarginalPairs["1_to_"+strconv.Itoa(fc.Count)] = (fc.Summary["to_running_ms"].Median - base) / float64(fc.Count-1)
		}
	}
	return fr
}

// fanOutOnce forks src into n siblings named name-1..name-n (or name for
// n = 1) with one capture.
func (b *Bench) fanOutOnce(ctx context.Context, src *Source, name string, n int) (*Sample, []string, error) {
	var names []string
	if n == 1 {
		names = []string{name}
	} else {
		for i := 1; i <= n; i++ {
			names = append(names, fmt.Sprintf("%s-%d", name, i))
		}
	}
	for _, s := range names {
		b.track(s)
	}
	if _, err := src.Holder.poke(ctx); err != nil {
		return nil, names, err
	}
	st, wall, err := b.runPodmanFork(ctx, src, name, n)
	if err != nil {
		return nil, names, err
	}
	last := st.Siblings[n-1].Name
	execD, gap, err := b.firstCommand(ctx, src, last, "the last sibling")
	if err != nil {
		return nil, names, err
	}
	var restoreSum, restoreMax float64
	for _, s := range st.Siblings {
		restoreSum += s.RestoreMs
		if s.RestoreMs > restoreMax {
			restoreMax = s.RestoreMs
		}
	}
	m := map[string]float64{
		"to_running_ms":         ms(wall),
		"last_first_command_ms": ms(wall + execD),
		"per_sibling_ms":        ms(wall) / float64(n),
		"checkpoint_ms":         st.CheckpointMs,
		"pause_ms":              st.SourcePauseMs,
		"observer_gap_ms":       gap.MaxGapMs,
		"restore_mean_ms":       restoreSum / float64(n),
		"restore_max_ms":        restoreMax,
		"tmpfs_bytes":           float64(st.Capture.Pages.BytesWritten),
	}
	rt, err := b.ociRuntime(ctx, last)
	if err != nil {
		return nil, names, err
	}
	return &Sample{Sibling: fmt.Sprintf("%s (%d)", name, n), RestoreRuntime: rt, Metrics: m}, names, nil
}
