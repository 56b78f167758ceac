package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// fanOutVariant is one way of running the fan-out: a --memory and a
// --parallel (0: podman-fork's default).
type fanOutVariant struct {
	Memory   string
	Parallel int
}

func (v fanOutVariant) name() string { return fmt.Sprintf("%s:%d", v.Memory, v.Parallel) }

// parseVariants reads --fan-out-variants: MEMORY:PARALLEL, comma-separated.
func parseVariants(s string) ([]fanOutVariant, error) {
	var out []fanOutVariant
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mem, par, ok := strings.Cut(f, ":")
		n, err := strconv.Atoi(par)
		if !ok || err != nil || n < 0 || (mem != "copy" && mem != "lazy") {
			return nil, fmt.Errorf("fan-out variant %q: want MEMORY:PARALLEL, memory copy or lazy, parallel 0 (the default) or more", f)
		}
		v := fanOutVariant{Memory: mem, Parallel: n}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("fan-out variant %q given twice", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func variantNames(vs []fanOutVariant) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.name()
	}
	return out
}

// parseKinds reads a list of workload kinds, the value of the flag name
// (--lazy-kinds, --twin-kinds).
func parseKinds(name, s string) ([]string, error) {
	out := []string{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f != "procs" && f != "mem" && f != "workspace" {
			return nil, fmt.Errorf("%s: unknown workload kind %q (procs, mem, workspace)", name, f)
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("%s: workload kind %q given twice", name, f)
		}
		out = append(out, f)
	}
	return out, nil
}

// defaultParallel is podman-fork's default --parallel on this machine
// (shim/podmanfork.DefaultParallel).
func defaultParallel() int { return min(runtime.NumCPU(), 4) }

// runFanOut forks one source into 1, 4 and 16 siblings (one capture each
// time) in every variant, and derives the marginal cost of an extra
// sibling.
//
// The fan-out runs podman-fork without --print-stats: --print-stats waits
// for every sibling's memory, and a sibling's wait holds its restore slot,
// so the later siblings of a lazy fan-out would start only as earlier
// ones completed their memory, which a fork without it does not do. The
// harness reads the source pause from the observer, and when the
// siblings' memory was complete from their tasks (filling).
func (b *Bench) runFanOut(ctx context.Context) *FanOutResult {
	w := memWorkload(b.cfg.FanOutMemMiB, b.cfg.MemProcs)
	w.Name = "fanout-" + w.Name
	fr := &FanOutResult{Workload: w.Name + ": " + w.Description}
	prefix := fmt.Sprintf("tcb-%s-fan", b.runID)
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.fail(w.Name, MethodTclone, -1, fmt.Errorf("starting the fan-out source: %w", err))
		b.removeContainers(prefix + "-src")
		fr.Failures++
		return fr
	}
	defer b.removeContainers(src.Name)

	for vi, v := range b.cfg.FanOutVariants {
		if ctx.Err() != nil {
			break
		}
		reps := b.cfg.FanOutReps
		if vi > 0 {
			reps = b.cfg.FanOutExtraReps
		}
		fv := &FanOutVariant{Name: v.name(), Memory: v.Memory, Parallel: v.Parallel, ParallelUsed: v.Parallel, Reps: reps,
			MarginalPairs: map[string]float64{}, MarginalOverFirst: map[string]float64{}}
		if v.Parallel == 0 {
			fv.ParallelUsed = defaultParallel()
		}
		fr.Variants = append(fr.Variants, fv)
		method := fmt.Sprintf("%s --memory %s --parallel %d", MethodTclone, v.Memory, fv.ParallelUsed)
		vprefix := fmt.Sprintf("%s%d", prefix, vi)

		// One discarded fork first, so that every measured fork is warm.
		if _, sib, err := b.fanOutOnce(ctx, src, vprefix+"-warmup", 1, v); err != nil {
			b.fail(w.Name, method+" (warm-up)", -1, err)
			b.removeContainers(sib...)
		} else {
			b.removeContainers(sib...)
		}
		for _, n := range b.cfg.FanOutCounts {
			fc := &FanOutCount{Count: n}
			fv.Counts = append(fv.Counts, fc)
			for rep := 0; rep < reps && ctx.Err() == nil; rep++ {
				b.logf("  fan-out %s, %d siblings, rep %d/%d", v.name(), n, rep+1, reps)
				s, sibs, err := b.fanOutOnce(ctx, src, fmt.Sprintf("%s-%d-r%d", vprefix, n, rep), n, v)
				b.removeContainers(sibs...)
				if err != nil {
					b.fail(w.Name, fmt.Sprintf("%s --count %d", method, n), rep, err)
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
		fv.marginal()
	}
	return fr
}

// marginal derives the marginal cost of an extra sibling from the time to
// all siblings running.
func (fv *FanOutVariant) marginal() {
	var xs, ys []float64
	var base float64
	for _, fc := range fv.Counts {
		for _, s := range fc.Samples {
			xs = append(xs, float64(fc.Count))
			ys = append(ys, s.Metrics["to_running_ms"])
		}
		if fc.Count == 1 {
			base = fc.Summary["to_running_ms"].Median
		}
	}
	if sl := slope(xs, ys); sl == sl { // not NaN
		fv.MarginalMsPerChild = sl
	}
	for _, fc := range fv.Counts {
		if fc.Count > 1 && base > 0 && fc.Summary["to_running_ms"].N > 0 {
			k := "1_to_" + strconv.Itoa(fc.Count)
			fv.MarginalPairs[k] = (fc.Summary["to_running_ms"].Median - base) / float64(fc.Count-1)
			fv.MarginalOverFirst[k] = fv.MarginalPairs[k] / base
		}
	}
}

// fanOutOnce forks src into n siblings named name-1..name-n (or name for
// n = 1) with one capture, in variant v.
func (b *Bench) fanOutOnce(ctx context.Context, src *Source, name string, n int, v fanOutVariant) (*Sample, []string, error) {
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
	start := time.Now()
	st, wall, err := b.runPodmanFork(ctx, src, forkRequest{name: name, count: n, memory: v.Memory, parallel: v.Parallel})
	if err != nil {
		return nil, names, err
	}
	// The siblings' memory is watched from now on, while the first
	// command runs.
	type memDone struct {
		at    time.Duration
		first time.Duration
		err   error
	}
	memc := make(chan memDone, 1)
	go func() {
		at, first, err := b.waitMemoryComplete(ctx, names, start)
		memc <- memDone{at, first, err}
	}()
	last := st.Siblings[n-1].Name
	execD, gap, err := b.firstCommand(ctx, src, last, "the last sibling")
	md := <-memc
	if err != nil {
		return nil, names, err
	}
	if md.err != nil {
		return nil, names, md.err
	}
	var restoreSum, restoreMax, runningMax float64
	for _, s := range st.Siblings {
		restoreSum += s.RestoreMs
		restoreMax = max(restoreMax, s.RestoreMs)
		runningMax = max(runningMax, s.RunningMs)
	}
	m := map[string]float64{
		"to_running_ms":         ms(wall),
		"last_first_command_ms": ms(wall + execD),
		"per_sibling_ms":        ms(wall) / float64(n),
		"observer_gap_ms":       gap.MaxGapMs,
		"restore_mean_ms":       restoreSum / float64(n),
		"restore_max_ms":        restoreMax,
		"internal_running_ms":   runningMax,
		"memory_complete_ms":    ms(md.at),
		"memory_first_look_ms":  ms(md.first),
		"cli_exec_ms":           ms(execD),
	}
	rt, err := b.ociRuntime(ctx, last)
	if err != nil {
		return nil, names, err
	}
	return &Sample{Sibling: fmt.Sprintf("%s (%d)", name, n), RestoreRuntime: rt, Metrics: m}, names, nil
}

// waitMemoryComplete waits until no task of the containers names is
// receiving its memory from a lazy-pages daemon, and returns when it saw
// that, and when it first looked (after reading their PIDs), both since
// start: a memory completed before the first look is dated then.
func (b *Bench) waitMemoryComplete(ctx context.Context, names []string, start time.Time) (at, first time.Duration, err error) {
	out, _, err := b.tools.podman(ctx, append([]string{"inspect", "--format", "{{.State.Pid}}"}, names...)...)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the siblings' PIDs: %w", err)
	}
	var inits []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return 0, 0, fmt.Errorf("a sibling has no running init (State.Pid %q)", f)
		}
		inits = append(inits, pid)
	}
	if len(inits) != len(names) {
		return 0, 0, fmt.Errorf("podman inspect gave %d PIDs for %d siblings", len(inits), len(names))
	}
	deadline := time.Now().Add(cmdTimeout)
	for {
		now := time.Since(start)
		if first == 0 {
			first = now
		}
		filling, err := anyFilling(inits)
		if err != nil {
			return 0, 0, err
		}
		if !filling {
			return now, first, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, 0, fmt.Errorf("the siblings' memory was not complete %s after the fork", time.Since(start).Round(time.Second))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// anyFilling reports whether a task in the PID namespace of any of inits
// still receives its memory lazily.
func anyFilling(inits []int) (bool, error) {
	for _, init := range inits {
		pids, err := nsProcs(init)
		if err != nil {
			return false, fmt.Errorf("listing the tasks of sibling init %d: %w", init, err)
		}
		for _, p := range pids {
			filling, err := filling(p)
			if err != nil {
				continue // exited meanwhile
			}
			if filling {
				return true, nil
			}
		}
	}
	return false, nil
}

// filling reports whether task pid still has memory registered with a
// userfaultfd in missing mode ("um" in its smaps VmFlags), the test tclone
// itself makes (criuhooks/lazypages.Filling, which this module cannot
// link: its CRIU image types clash with go-criu's stats package that the
// raw CRIU baseline reads).
func filling(pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return false, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if flags, ok := bytes.CutPrefix(line, []byte("VmFlags:")); ok && slices.Contains(strings.Fields(string(flags)), "um") {
			return true, nil
		}
	}
	return false, nil
}
