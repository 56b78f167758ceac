package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Metrics each method's samples must carry: "positive" ones must be > 0,
// "present" ones >= 0 (a container that wrote no file has 0 disk bytes).
var requiredMetrics = map[string]struct{ positive, present []string }{
	MethodTclone:     tcloneMetrics,
	MethodTcloneLazy: tcloneMetrics,
	MethodTcloneTwin: {
		positive: append(slices.Clone(tcloneMetrics.positive), "twins", "held_processes"),
		present:  append(slices.Clone(tcloneMetrics.present), "twins_took_ms"),
	},
	MethodPodman: {
		positive: []string{"pause_ms", "observer_gap_ms", "to_running_ms", "first_command_ms", "exec_ms", "checkpoint_ms", "restore_ms",
			"tmpfs_bytes", "disk_bytes", "pages_written", "source_rss_kib", "source_pss_kib", "sibling_rss_kib", "sibling_pss_kib", "source_procs", "sibling_procs"},
		present: []string{"criu_freezing_ms", "criu_frozen_ms"},
	},
	MethodCriu: {
		positive: []string{"pause_ms", "observer_gap_ms", "to_running_ms", "dump_ms", "restore_ms", "tmpfs_bytes", "pages_written",
			"source_rss_kib", "source_pss_kib", "sibling_rss_kib", "sibling_pss_kib", "source_procs", "sibling_procs"},
		present: []string{"disk_bytes"},
	},
	MethodFork: {
		positive: []string{"fork_ms", "fork_tiny_ms", "floor_ms", "floor_procs"},
		present:  []string{"floor_mem_mib"},
	},
}

var tcloneMetrics = struct{ positive, present []string }{
	positive: []string{"pause_ms", "observer_gap_ms", "to_running_ms", "first_command_ms", "memory_complete_ms", "exec_ms", "cli_exec_ms", "client_ms",
		"fork_wall_ms", "checkpoint_ms", "restore_ms", "tmpfs_bytes", "pages_written", "dump_ms",
		"source_rss_kib", "source_pss_kib", "sibling_rss_kib", "sibling_pss_kib", "source_procs", "sibling_procs"},
	present: []string{"disk_bytes", "freeze_ms", "fs_snapshot_ms", "thaw_ms", "ready_ms"},
}

// tcloneOrder are metrics of a tclone fork that happen in this order, on
// one clock: each must be at least the one before.
var tcloneOrder = []string{"to_running_ms", "first_command_ms", "memory_complete_ms", "fork_wall_ms"}

// wantRuntime is what must have restored each method's copies: a stock
// baseline restored by tclone would not be stock.
var wantRuntime = map[string]string{MethodTclone: "tclone", MethodTcloneLazy: "tclone", MethodTcloneTwin: "tclone", MethodPodman: stockRuntime, MethodCriu: "criu"}

var requiredFanOut = []string{"to_running_ms", "last_first_command_ms", "per_sibling_ms", "observer_gap_ms", "restore_mean_ms", "restore_max_ms",
	"internal_running_ms", "memory_complete_ms", "memory_first_look_ms", "cli_exec_ms"}

// targetKeys are the targets every run reports, besides one per fan-out
// variant.
var targetKeys = []string{"first_command_1g_lazy_over_stock", "first_command_1g_copy_over_stock", "first_command_2g_lazy_over_stock",
	"first_command_2g_copy_over_stock", "first_command_2g_over_0_lazy", "pause_1g_copy_over_lazy", "pause_2g_copy_over_lazy",
	"first_command_1g_twin_over_stock", "first_command_2g_twin_over_stock", "pause_1g_twin_within_fork", "twin_pause_ms_per_process",
	"twin_source_throughput_after_thaw"}

// validate checks that a run's outputs are well formed: results.json
// parses and holds every expected workload, method and metric, the
// markdown has its sections and links, and every plot is a PNG. It never
// looks at how fast anything was. want, if not nil, is the run's own
// result, to compare the file against.
func validate(dir, markdown string, want *Results) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return []string{fmt.Sprintf("results.json: %v", err)}
	}
	var r Results
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return []string{fmt.Sprintf("results.json does not parse: %v", err)}
	}
	if r.Schema != SchemaVersion {
		bad("results.json: schema %d, want %d", r.Schema, SchemaVersion)
	}
	if want != nil && (len(r.Workloads) != len(want.Workloads) || r.Quick != want.Quick) {
		bad("results.json does not hold this run's results")
	}
	if r.Started.IsZero() || r.Finished.Before(r.Started) {
		bad("results.json: bad start/finish times")
	}
	m := r.Machine
	for name, v := range map[string]string{"cpu_model": m.CPUModel, "mem_total": m.MemTotal, "kernel": m.Kernel, "os": m.OS,
		"podman": m.Podman, "crun": m.Crun, "criu": m.Criu, "tclone": m.Tclone, "go": m.Go} {
		if strings.TrimSpace(v) == "" || strings.HasPrefix(v, "unknown") {
			bad("machine.%s is missing (%q)", name, v)
		}
	}
	if m.CPUs <= 0 {
		bad("machine.cpus is %d", m.CPUs)
	}

	// Every configured workload, with every method.
	var expected []string
	for _, n := range r.Config.ProcCounts {
		expected = append(expected, procsWorkload(n).Name)
	}
	for _, n := range r.Config.MemMiBs {
		expected = append(expected, memWorkload(n, r.Config.MemProcs).Name)
	}
	if r.Config.Workspace {
		expected = append(expected, "workspace")
	}
	var names []string
	for _, w := range r.Workloads {
		names = append(names, w.Name)
	}
	for _, e := range expected {
		if !slices.Contains(names, e) {
			bad("workload %s is missing", e)
		}
	}
	for _, w := range r.Workloads {
		allMeasured := true
		lazy := slices.Contains(r.Config.LazyKinds, w.Kind)
		twin := slices.Contains(r.Config.TwinKinds, w.Kind)
		for _, meth := range methodOrder {
			mr := w.Methods[meth]
			if meth == MethodTcloneLazy && !lazy {
				if mr != nil {
					bad("%s: method %s measured, but its kind %s is not in lazy_kinds %v", w.Name, meth, w.Kind, r.Config.LazyKinds)
				}
				continue
			}
			if meth == MethodTcloneTwin && !twin {
				if mr != nil {
					bad("%s: method %s measured, but its kind %s is not in twin_kinds %v", w.Name, meth, w.Kind, r.Config.TwinKinds)
				}
				continue
			}
			if mr == nil {
				bad("%s: method %s is missing", w.Name, meth)
				allMeasured = false
				continue
			}
			if mr.NotMeasured != "" {
				allMeasured = false
				if meth != MethodCriu || w.Kind != "workspace" {
					bad("%s: %s not measured: %s", w.Name, meth, mr.NotMeasured)
				}
				continue
			}
			problems = append(problems, validateMethod(w.Name, mr)...)
		}
		wantRatios := []string{"podman_over_tclone_pause", "podman_over_tclone_observer_gap", "podman_over_tclone_to_running",
			"podman_over_tclone_first_command", "tclone_over_fork_pause", "tclone_over_fork_to_running", "podman_over_tclone_sibling_pss"}
		if allMeasured {
			wantRatios = append(wantRatios, "criu_over_tclone_pause", "criu_over_tclone_observer_gap", "criu_over_tclone_to_running")
		}
		if lazy {
			wantRatios = append(wantRatios, lazyRatios...)
		}
		if twin {
			wantRatios = append(wantRatios, twinRatios...)
		}
		for _, k := range wantRatios {
			if v, ok := w.Ratios[k]; !ok || v <= 0 {
				bad("%s: ratio %s missing or not positive", w.Name, k)
			}
		}
	}

	// Fan-out.
	if len(r.Config.FanOutCounts) > 0 {
		problems = append(problems, validateFanOut(&r)...)
	}

	// Headline.
	h := r.Headline
	if len(r.Config.MemMiBs) > 0 {
		if h.MemWorkload == "" {
			bad("headline: no memory workload")
		}
		c := h.Cold
		for name, v := range map[string]float64{"pause_ratio": h.PauseRatio, "observer_gap_ratio": h.GapRatio, "first_command_ratio": h.FirstCommandRatio,
			"tclone_pause_ms": h.TclonePauseMs, "podman_pause_ms": h.PodmanPauseMs, "tclone_first_command_ms": h.TcloneFirstCommandMs, "podman_first_command_ms": h.PodmanFirstCommandMs,
			"cold.pause_ratio": c.PauseRatio, "cold.observer_gap_ratio": c.GapRatio, "cold.first_command_ratio": c.FirstCommandRatio,
			"cold.tclone_pause_ms": c.TclonePauseMs, "cold.podman_pause_ms": c.PodmanPauseMs, "cold.tclone_first_command_ms": c.TcloneFirstCommandMs,
			"cold.podman_first_command_ms": c.PodmanFirstCommandMs, "tclone_pause_range_ms max": h.TclonePauseRange[1], "podman_pause_range_ms max": h.PodmanPauseRange[1]} {
			if v <= 0 {
				bad("headline: %s missing or not positive", name)
			}
		}
	}
	if len(r.Config.MemMiBs) > 0 && slices.Contains(r.Config.LazyKinds, "mem") {
		l, lc := h.Lazy, h.LazyCold
		for name, v := range map[string]float64{"lazy.first_command_ratio": l.FirstCommandRatio, "lazy.tclone_first_command_ms": l.TcloneFirstCommandMs,
			"lazy.tclone_pause_ms": l.TclonePauseMs, "lazy_cold.first_command_ratio": lc.FirstCommandRatio, "lazy_cold.tclone_first_command_ms": lc.TcloneFirstCommandMs} {
			if v <= 0 {
				bad("headline: %s missing or not positive", name)
			}
		}
	}
	if len(r.Config.MemMiBs) > 0 && slices.Contains(r.Config.TwinKinds, "mem") {
		t, tc := h.Twin, h.TwinCold
		for name, v := range map[string]float64{"twin.first_command_ratio": t.FirstCommandRatio, "twin.tclone_first_command_ms": t.TcloneFirstCommandMs,
			"twin.tclone_pause_ms": t.TclonePauseMs, "twin.tclone_observer_gap_ms": t.TcloneGapMs, "twin_cold.first_command_ratio": tc.FirstCommandRatio,
			"twin_cold.tclone_first_command_ms": tc.TcloneFirstCommandMs, "twin_cold.tclone_pause_ms": tc.TclonePauseMs} {
			if v <= 0 {
				bad("headline: %s missing or not positive", name)
			}
		}
	}
	if len(r.Config.ProcCounts) >= 2 && slices.Contains(r.Config.TwinKinds, "procs") && (h.TwinMsPerProcess == 0 || h.TwinPauseMsPerProcess == 0) {
		bad("headline: a --memory twin ms/process slope is missing")
	}
	problems = append(problems, validateForkRef(&r)...)
	problems = append(problems, validateTargets(&r)...)
	problems = append(problems, validateForkModes(&r)...)
	problems = append(problems, validateBranches(&r)...)
	problems = append(problems, validateCRI(&r)...)
	problems = append(problems, validateThroughput(&r)...)
	// A slope may be negative on a noisy machine; it must exist.
	if len(r.Config.ProcCounts) >= 2 && (h.TcloneMsPerProcess == 0 || h.TclonePauseMsPerProcess == 0 || h.PodmanMsPerProcess == 0) {
		bad("headline: a ms/process slope is missing")
	}

	// Markdown and plots.
	md, err := os.ReadFile(markdown)
	if err != nil {
		bad("markdown: %v", err)
	} else {
		text := string(md)
		sections := []string{"# Benchmarks", "## Headline", "## Targets", "## Machine", "## How it was measured", "## Ratios", "## Cold vs warm",
			"## Memory of source and sibling", "## Bytes written", "## Where a tclone fork's time goes", "## fork() floor", "## Not measured, failures"}
		if len(r.Config.ProcCounts) > 0 {
			sections = append(sections, "## Process-count sweep")
		}
		if len(r.Config.MemMiBs) > 0 {
			sections = append(sections, "## Memory sweep")
		}
		if r.Config.Workspace {
			sections = append(sections, "## Realistic workspace")
		}
		if len(r.Config.FanOutCounts) > 0 {
			sections = append(sections, "## Fan-out")
		}
		sections = append(sections, "## Files-only forks")
		if r.Config.VolumeMiB > 0 {
			sections = append(sections, "## Named volumes")
		}
		if r.Config.KSMMemMiB > 0 {
			sections = append(sections, "## --memory ksm")
		}
		if r.Config.ProxyReps > 0 {
			sections = append(sections, "## REST proxy")
		}
		if r.Config.BranchMemMiB > 0 {
			sections = append(sections, "## Branches")
		}
		if r.Config.CRIMemMiB > 0 {
			sections = append(sections, "## Forks through containerd's CRI")
		}
		if r.Config.ThroughputMemMiB > 0 {
			sections = append(sections, "## Source speed after the fork")
		}
		for _, s := range sections {
			if !strings.Contains(text, "\n"+s+"\n") && !strings.HasPrefix(text, s+"\n") {
				bad("markdown: section %q missing", s)
			}
		}
		for _, f := range plotFiles {
			if !strings.Contains(text, f.File+")") {
				bad("markdown: no link to %s", f.File)
			}
		}
		if strings.Contains(text, "NaN") {
			bad("markdown: contains NaN")
		}
	}
	for _, f := range plotFiles {
		path := filepath.Join(dir, f.File)
		fh, err := os.Open(path)
		if err != nil {
			bad("plot %s: %v", f.File, err)
			continue
		}
		cfg, err := png.DecodeConfig(fh)
		fh.Close()
		if err != nil || cfg.Width < 100 || cfg.Height < 100 {
			bad("plot %s is not a usable PNG (%v, %dx%d)", f.File, err, cfg.Width, cfg.Height)
		}
	}
	return problems
}

func validateMethod(workload string, mr *MethodResult) []string {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s / %s: ", workload, mr.Method)+fmt.Sprintf(format, args...))
	}
	req := requiredMetrics[mr.Method]
	var cold, warm int
	for _, s := range mr.Samples {
		if want, ok := wantRuntime[mr.Method]; ok && s.RestoreRuntime != want {
			bad("rep %d: restored by %q, want %q", s.Rep, s.RestoreRuntime, want)
		}
		if s.Cold {
			cold++
		} else {
			warm++
		}
		for _, k := range req.positive {
			if v, ok := s.Metrics[k]; !ok || v <= 0 {
				bad("rep %d: %s missing or not positive (%v)", s.Rep, k, v)
			}
		}
		for _, k := range req.present {
			if v, ok := s.Metrics[k]; !ok || v < 0 {
				bad("rep %d: %s missing or negative", s.Rep, k)
			}
		}
		if mr.Method == MethodTcloneTwin && s.Metrics["twins"] != s.Metrics["held_processes"] {
			bad("rep %d: %v twins for %v held processes: not every process got a twin", s.Rep, s.Metrics["twins"], s.Metrics["held_processes"])
		}
		if mr.Method == MethodTclone || mr.Method == MethodTcloneLazy || mr.Method == MethodTcloneTwin {
			for i := 1; i < len(tcloneOrder); i++ {
				a, b := tcloneOrder[i-1], tcloneOrder[i]
				if s.Metrics[b] < s.Metrics[a] {
					bad("rep %d: %s (%v) before %s (%v)", s.Rep, b, s.Metrics[b], a, s.Metrics[a])
				}
			}
		}
	}
	if cold != 1 {
		bad("%d cold samples, want 1", cold)
	}
	if warm < 1 {
		bad("no warm sample")
	}
	for _, k := range req.positive {
		if st, ok := mr.Warm[k]; warm > 0 && (!ok || st.N != warm || st.Median <= 0 || st.P95 < st.Median) {
			bad("warm summary of %s is inconsistent (%+v)", k, st)
		}
		if _, ok := mr.Cold[k]; cold == 1 && !ok {
			bad("cold value of %s missing", k)
		}
	}
	if mr.Method != MethodFork {
		if mr.IdleGapMs <= 0 {
			bad("idle observer gap missing")
		}
		if mr.Later == nil {
			bad("the later memory reading is missing")
		} else if mr.Later.AfterS <= 0 || mr.Later.Source.PssKiB <= 0 || mr.Later.Sibling.PssKiB <= 0 || mr.Later.Sibling.RssKiB <= 0 {
			bad("the later memory reading is incomplete (%+v)", *mr.Later)
		}
	}
	return problems
}

// validateFanOut checks the fan-out: every configured variant, in order,
// with every count, well-formed samples and marginal costs.
func validateFanOut(r *Results) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	fo := r.FanOut
	if fo == nil {
		return []string{"fan_out is missing"}
	}
	var names []string
	for i, v := range fo.Variants {
		names = append(names, v.Name)
		if v.Memory != "copy" && v.Memory != "lazy" {
			bad("fan-out %s: memory %q", v.Name, v.Memory)
		}
		if v.Name != fmt.Sprintf("%s:%d", v.Memory, v.Parallel) || v.ParallelUsed < 1 || (v.Parallel > 0 && v.ParallelUsed != v.Parallel) {
			bad("fan-out %s: memory %q, parallel %d (used %d) do not match its name", v.Name, v.Memory, v.Parallel, v.ParallelUsed)
		}
		wantReps := r.Config.FanOutReps
		if i > 0 {
			wantReps = r.Config.FanOutExtraReps
		}
		if v.Reps != wantReps {
			bad("fan-out %s: %d repetitions, want %d", v.Name, v.Reps, wantReps)
		}
		var counts []int
		for _, fc := range v.Counts {
			counts = append(counts, fc.Count)
			if len(fc.Samples) == 0 {
				bad("fan-out %s, %d siblings: no sample", v.Name, fc.Count)
				continue
			}
			for _, s := range fc.Samples {
				if s.RestoreRuntime != wantRuntime[MethodTclone] {
					bad("fan-out %s, %d siblings, rep %d: restored by %q, want %q", v.Name, fc.Count, s.Rep, s.RestoreRuntime, wantRuntime[MethodTclone])
				}
				for _, k := range requiredFanOut {
					if x, ok := s.Metrics[k]; !ok || x <= 0 {
						bad("fan-out %s, %d siblings, rep %d: %s missing or not positive", v.Name, fc.Count, s.Rep, k)
					}
				}
				// On one clock, from the start of podman-fork: it
				// returned once all ran, and memory was looked at after.
				if s.Metrics["memory_complete_ms"] < s.Metrics["memory_first_look_ms"] || s.Metrics["memory_first_look_ms"] < s.Metrics["to_running_ms"] ||
					s.Metrics["last_first_command_ms"] < s.Metrics["to_running_ms"] {
					bad("fan-out %s, %d siblings, rep %d: times out of order (%v)", v.Name, fc.Count, s.Rep, s.Metrics)
				}
			}
			if st := fc.Summary["to_running_ms"]; st.N != len(fc.Samples) || st.Median <= 0 {
				bad("fan-out %s, %d siblings: summary does not match its samples", v.Name, fc.Count)
			}
		}
		if !slices.Equal(counts, r.Config.FanOutCounts) {
			bad("fan-out %s: counts %v, want %v", v.Name, counts, r.Config.FanOutCounts)
		}
		for _, n := range r.Config.FanOutCounts {
			if n > 1 && slices.Contains(r.Config.FanOutCounts, 1) {
				k := fmt.Sprintf("1_to_%d", n)
				if _, ok := v.MarginalPairs[k]; !ok {
					bad("fan-out %s: marginal cost %s missing", v.Name, k)
				}
				if x, ok := v.MarginalOverFirst[k]; !ok || x == 0 {
					bad("fan-out %s: marginal cost over the first %s missing", v.Name, k)
				}
			}
		}
		if v.MarginalMsPerChild == 0 {
			bad("fan-out %s: marginal cost per child missing", v.Name)
		}
	}
	if !slices.Equal(names, r.Config.FanOutVariants) {
		bad("fan-out variants %v, want %v", names, r.Config.FanOutVariants)
	}
	return problems
}

// validateForkRef checks the fork() reference: measured when the run
// asked for it, with every fork timed and the median of its samples.
func validateForkRef(r *Results) []string {
	fr := r.ForkRef
	switch {
	case r.Config.ForkRefMiB <= 0:
		if fr != nil {
			return []string{"fork_ref: measured, though fork_ref_mib is 0"}
		}
		return nil
	case fr == nil:
		return []string{"fork_ref: not run"}
	case fr.Error != "":
		return []string{"fork_ref: failed: " + firstLine(fr.Error)}
	case fr.MemMiB != r.Config.ForkRefMiB || len(fr.ForkMs) != r.Config.ForkRefReps:
		return []string{fmt.Sprintf("fork_ref: %d forks of %d MiB, want %d of %d MiB", len(fr.ForkMs), fr.MemMiB, r.Config.ForkRefReps, r.Config.ForkRefMiB)}
	case fr.MedianMs <= 0 || math.Abs(fr.MedianMs-summarize(fr.ForkMs).Median) > 1e-6:
		return []string{fmt.Sprintf("fork_ref: median %v ms does not match its samples %v", fr.MedianMs, fr.ForkMs)}
	case fr.RssKiB < int64(fr.MemMiB)*1024:
		return []string{fmt.Sprintf("fork_ref: the forked process held %d KiB, less than the %d MiB it touched", fr.RssKiB, fr.MemMiB)}
	case fr.RewriteMs <= 0 || fr.RewriteAfterForkMs <= 0:
		return []string{fmt.Sprintf("fork_ref: no rewrite times (%v ms after a fork(), %v ms without)", fr.RewriteAfterForkMs, fr.RewriteMs)}
	}
	return nil
}

// validateTargets checks that every target is there, once, with a known
// status that agrees with its value and bound.
func validateTargets(r *Results) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	want := slices.Clone(targetKeys)
	if r.Config.VolumeMiB > 0 {
		want = append(want, "volume_reflink_added_pause_ms")
	}
	if r.Config.KSMMemMiB > 0 {
		want = append(want, "ksm_sibling_pss_over_rss_60s")
	}
	if r.Config.ProxyReps > 0 {
		want = append(want, proxyTargetKeys...)
	}
	if r.Config.BranchMemMiB > 0 {
		want = append(want, branchTargetKeys...)
	}
	if r.Config.CRIMemMiB > 0 {
		want = append(want, criTargetKeys...)
	}
	if len(r.Config.FanOutCounts) > 0 {
		for _, v := range r.Config.FanOutVariants {
			want = append(want, "fanout_marginal_over_first_"+v)
		}
	}
	var got []string
	for _, t := range r.Headline.Targets {
		got = append(got, t.Key)
		if t.Title == "" || t.BoundText == "" {
			bad("target %s: no title or bound text", t.Key)
		}
		switch t.Status {
		case TargetMet, TargetNotMet:
			if t.Bound <= 0 || (t.Value <= 0 && !t.Difference) || (t.Status == TargetMet) != (t.Value <= t.Bound) {
				bad("target %s: status %q does not agree with value %v and bound %v", t.Key, t.Status, t.Value, t.Bound)
			}
		case TargetNoBound, TargetOtherSize:
			if t.Value <= 0 && !t.Difference {
				bad("target %s: status %q without a value", t.Key, t.Status)
			}
		case TargetNotMeasured:
			if t.Value != 0 {
				bad("target %s: not measured, yet a value %v", t.Key, t.Value)
			}
		default:
			bad("target %s: unknown status %q", t.Key, t.Status)
		}
		if t.Status != TargetNotMeasured && t.Detail == "" {
			bad("target %s: no detail", t.Key)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		bad("targets %v, want %v", got, want)
	}
	// A run that measured what a target needs at the sizes must
	// have computed it.
	has := func(mib int) bool {
		return slices.Contains(r.Config.MemMiBs, mib) && slices.Contains(r.Config.LazyKinds, "mem")
	}
	hasTwin := func(mib int) bool {
		return slices.Contains(r.Config.MemMiBs, mib) && slices.Contains(r.Config.TwinKinds, "mem")
	}
	for _, t := range r.Headline.Targets {
		var need bool
		switch t.Key {
		case "first_command_1g_lazy_over_stock", "first_command_1g_copy_over_stock", "pause_1g_copy_over_lazy":
			need = has(1024)
		case "first_command_2g_lazy_over_stock", "first_command_2g_copy_over_stock", "pause_2g_copy_over_lazy":
			need = has(2048)
		case "first_command_2g_over_0_lazy":
			need = has(2048) && has(0)
		case "first_command_1g_twin_over_stock":
			need = hasTwin(1024)
		case "first_command_2g_twin_over_stock":
			need = hasTwin(2048)
		case "pause_1g_twin_within_fork":
			need = hasTwin(1024) && hasTwin(0) && r.Config.ForkRefMiB == 1024
		case "twin_pause_ms_per_process":
			need = slices.Contains(r.Config.TwinKinds, "procs") && slices.Contains(r.Config.ProcCounts, twinSweepEnds[0]) && slices.Contains(r.Config.ProcCounts, twinSweepEnds[1])
		case "twin_source_throughput_after_thaw":
			need = r.Config.ThroughputMemMiB == 1024
		case "volume_reflink_added_pause_ms":
			need = r.Config.VolumeMiB == 1024
		case "ksm_sibling_pss_over_rss_60s":
			need = r.Config.KSMMemMiB == 1024 && r.Config.KSMWindowS >= 60
		case proxyTargetKeys[0], proxyTargetKeys[1]:
			need = !r.Quick
		case branchTargetKeys[0], branchTargetKeys[1], branchTargetKeys[2], branchTargetKeys[3], branchTargetKeys[4]:
			need = r.Config.BranchMemMiB == 1024 && !r.Quick
		case criTargetKeys[0], criTargetKeys[1]:
			need = r.Config.CRIMemMiB == 1024 && !r.Quick
		default:
			need = slices.Contains(r.Config.FanOutCounts, 1) && slices.Contains(r.Config.FanOutCounts, 16)
		}
		if need && (t.Status == TargetNotMeasured || t.Status == TargetOtherSize) {
			bad("target %s: %s, though the run has its workloads", t.Key, t.Status)
		}
	}
	return problems
}

// validateForkModes checks the named-volume, files-only and --memory ksm
// sections: every variant measured with its repetitions, the copies the
// mode promises made (or not), the KSM window watched and ksmd's
// settings put back.
func validateForkModes(r *Results) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if r.Config.VolumeMiB > 0 {
		switch vr := r.Volumes; {
		case vr == nil:
			bad("volumes: not run")
		case len(vr.Variants) != len(volumeVariants):
			bad("volumes: %d variants, want %d", len(vr.Variants), len(volumeVariants))
		default:
			for i, v := range vr.Variants {
				mr := &MethodResult{Warm: v.Summary}
				st, _ := mr.warmStat("pause_ms")
				switch {
				case v.Name != volumeVariants[i].name:
					bad("volumes: variant %d is %q, want %q", i, v.Name, volumeVariants[i].name)
				case v.NotMeasured != "":
					bad("volume %s: not measured: %s", v.Name, v.NotMeasured)
				case st.N != r.Config.VolumeReps:
					bad("volume %s: %d warm samples, want %d", v.Name, st.N, r.Config.VolumeReps)
				}
				copied, reflinked := mr.warmMedian("copied_mib"), mr.warmMedian("reflinked_mib")
				switch v.Name {
				case "share":
					if copied != 0 {
						bad("volume share: %v MiB copied, want none", copied)
					}
				case "copy":
					if copied < float64(vr.SizeMiB) {
						bad("volume copy: %v MiB copied, want %d", copied, vr.SizeMiB)
					}
				case "reflink":
					if reflinked < float64(vr.SizeMiB) {
						bad("volume reflink: %v MiB reflinked, want %d", reflinked, vr.SizeMiB)
					}
				}
			}
		}
	}
	switch fr := r.FilesOnly; {
	case fr == nil:
		bad("files-only: not run")
	case len(fr.Sources) != 2:
		bad("files-only: %d sources, want 2", len(fr.Sources))
	default:
		for _, s := range fr.Sources {
			for _, k := range []string{"pause_ms", "to_running_ms"} {
				if st := s.Summary[k]; st.N != r.Config.WarmReps || st.Median <= 0 {
					bad("files-only %s: %s has %d warm samples (median %v), want %d", s.Workload, k, st.N, st.Median, r.Config.WarmReps)
				}
			}
		}
	}
	if r.Config.KSMMemMiB > 0 {
		switch kr := r.KSM; {
		case kr == nil:
			bad("ksm: not run")
		case len(kr.Points) < 2 || kr.Points[len(kr.Points)-1].AtS < r.Config.KSMWindowS:
			bad("ksm: %d samples, not through the %v s window", len(kr.Points), r.Config.KSMWindowS)
		case !kr.Restored:
			bad("ksm: ksmd's settings were not put back")
		}
	}
	if r.Config.ProxyReps > 0 {
		switch pr := r.Proxy; {
		case pr == nil:
			bad("rest proxy: not run")
		case len(pr.Requests) != len(proxyRequests):
			bad("rest proxy: %d requests measured, want %d", len(pr.Requests), len(proxyRequests))
		default:
			for _, q := range pr.Requests {
				if q.Podman.N == 0 || q.Podman.N != q.Tclone.N || q.Podman.Median <= 0 || q.Tclone.Median <= 0 {
					bad("rest proxy %s: %d and %d samples (medians %v, %v)", q.Name, q.Podman.N, q.Tclone.N, q.Podman.Median, q.Tclone.Median)
				}
			}
		}
	}
	return problems
}
