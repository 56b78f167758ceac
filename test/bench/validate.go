package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Metrics each method's samples must carry: "positive" ones must be > 0,
// "present" ones >= 0 (a container that wrote no file has 0 disk bytes).
var requiredMetrics = map[string]struct{ positive, present []string }{
	MethodTclone: {
		positive: []string{"pause_ms", "observer_gap_ms", "to_running_ms", "first_command_ms", "exec_ms", "checkpoint_ms", "restore_ms",
			"tmpfs_bytes", "pages_written", "dump_ms", "source_rss_kib", "source_pss_kib", "sibling_rss_kib", "sibling_pss_kib", "source_procs", "sibling_procs"},
		present: []string{"disk_bytes", "freeze_ms", "fs_snapshot_ms", "thaw_ms", "ready_ms"},
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

// wantRuntime is what must have restored each method's copies: a stock
// baseline restored by tclone would not be stock.
var wantRuntime = map[string]string{MethodTclone: "tclone", MethodPodman: stockRuntime, MethodCriu: "criu"}

var requiredFanOut = []string{"to_running_ms", "last_first_command_ms", "per_sibling_ms", "checkpoint_ms", "pause_ms", "observer_gap_ms", "restore_mean_ms", "tmpfs_bytes"}

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
		for _, meth := range methodOrder {
			mr := w.Methods[meth]
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
		for _, k := range wantRatios {
			if v, ok := w.Ratios[k]; !ok || v <= 0 {
				bad("%s: ratio %s missing or not positive", w.Name, k)
			}
		}
	}

	// Fan-out.
	if len(r.Config.FanOutCounts) > 0 {
		fo := r.FanOut
		if fo == nil {
			bad("fan_out is missing")
		} else {
			var counts []int
			for _, fc := range fo.Counts {
				counts = append(counts, fc.Count)
				if len(fc.Samples) == 0 {
					bad("fan-out %d: no sample", fc.Count)
					continue
				}
				for _, s := range fc.Samples {
					if s.RestoreRuntime != wantRuntime[MethodTclone] {
						bad("fan-out %d rep %d: restored by %q, want %q", fc.Count, s.Rep, s.RestoreRuntime, wantRuntime[MethodTclone])
					}
					for _, k := range requiredFanOut {
						if v, ok := s.Metrics[k]; !ok || v <= 0 {
							bad("fan-out %d rep %d: %s missing or not positive", fc.Count, s.Rep, k)
						}
					}
				}
				if st := fc.Summary["to_running_ms"]; st.N != len(fc.Samples) || st.Median <= 0 {
					bad("fan-out %d: summary does not match its samples", fc.Count)
				}
			}
			if !slices.Equal(counts, r.Config.FanOutCounts) {
				bad("fan-out counts %v, want %v", counts, r.Config.FanOutCounts)
			}
			for _, n := range r.Config.FanOutCounts {
				if n > 1 {
					if _, ok := fo.MarginalPairs[fmt.Sprintf("1_to_%d", n)]; !ok && slices.Contains(r.Config.FanOutCounts, 1) {
						bad("fan-out: marginal cost 1_to_%d missing", n)
					}
				}
			}
			if fo.MarginalMsPerChild == 0 {
				bad("fan-out: marginal cost per child missing")
			}
		}
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
		sections := []string{"# Benchmarks", "## Headline", "## Machine", "## How it was measured", "## Ratios", "## Cold vs warm",
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
