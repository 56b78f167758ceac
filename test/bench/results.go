package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// SchemaVersion is the layout version of results.json. Version 2 records
// the runtime of every restore and the headline's cold numbers; version 3
// splits tclone into --memory copy and --memory lazy, measures the fan-out
// in variants (memory, --parallel) and adds the targets; version 4
// adds named volumes, files-only forks and --memory ksm; version 5 what
// tclone's API service adds to requests; version 7 adds tclone with
// --memory twin (twin_kinds) and fork() of a fixed size (fork_ref);
// version 8 the source's write speed after its fork (throughput).
const SchemaVersion = 8

// Methods, in the order they are reported.
const (
	MethodTclone     = "tclone"      // podman container fork --memory copy
	MethodTcloneLazy = "tclone-lazy" // podman container fork --memory lazy
	MethodTcloneTwin = "tclone-twin" // podman container fork --memory twin
	MethodPodman     = "podman"      // stock checkpoint --export + restore --import, crun
	MethodCriu       = "criu"        // raw criu dump --leave-running + criu restore
	MethodFork       = "fork"        // fork() of a process with the same anonymous RSS
)

var methodTitles = map[string]string{
	MethodTclone:     "tclone fork, --memory copy",
	MethodTcloneLazy: "tclone fork, --memory lazy",
	MethodTcloneTwin: "tclone fork, --memory twin",
	MethodPodman:     "stock Podman checkpoint/restore (crun)",
	MethodCriu:       "raw CRIU dump/restore",
	MethodFork:       "fork() floor",
}

// Results is results.json.
type Results struct {
	Schema   int       `json:"schema"`
	Quick    bool      `json:"quick"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// DurationS is the wall time of the whole run.
	DurationS float64           `json:"duration_s"`
	Machine   Machine           `json:"machine"`
	Config    RunConfig         `json:"config"`
	Workloads []*WorkloadResult `json:"workloads"`
	FanOut    *FanOutResult     `json:"fan_out"`
	Volumes   *VolumeResult     `json:"volumes"`
	FilesOnly *FilesOnlyResult  `json:"files_only"`
	KSM       *KSMResult        `json:"ksm"`
	Proxy     *ProxyResult      `json:"rest_proxy"`
	Branches  *BranchResult     `json:"branches"`
	CRI       *CRIResult        `json:"cri"`
	// Throughput is a write-heavy source's speed after its fork, and how
	// long an idle source's twins outlive the thaw.
	Throughput *ThroughputResult `json:"throughput"`
	// ForkRef is fork() of one process holding a fixed amount of memory
	// (--fork-ref-mib, 1 GiB), the yardstick of the twin pause target.
	ForkRef  *ForkRefResult `json:"fork_ref"`
	Headline Headline       `json:"headline"`
	// Failures lists every measurement that could not be made, with the
	// exact error.
	Failures []Failure `json:"failures"`
	Notes    []string  `json:"notes"`
}

// RunConfig is what the run was asked to do.
type RunConfig struct {
	WarmReps      int   `json:"warm_reps"`
	LargeWarmReps int   `json:"large_warm_reps"`
	LargeFromMiB  int   `json:"large_from_mib"`
	ProcCounts    []int `json:"proc_counts"`
	MemMiBs       []int `json:"mem_mibs"`
	MemProcs      int   `json:"mem_procs"`
	Workspace     bool  `json:"workspace"`
	WorkspaceMiB  int   `json:"workspace_mib"`
	// LazyKinds are the workload kinds measured with --memory lazy too.
	LazyKinds []string `json:"lazy_kinds"`
	// TwinKinds are the workload kinds measured with --memory twin too.
	TwinKinds []string `json:"twin_kinds"`
	// ForkRefMiB and ForkRefReps size the fork() reference (0: none).
	ForkRefMiB   int   `json:"fork_ref_mib"`
	ForkRefReps  int   `json:"fork_ref_reps"`
	FanOutCounts []int `json:"fan_out_counts"`
	FanOutReps   int   `json:"fan_out_reps"`
	// FanOutVariants are the fan-out's memory:parallel variants; the
	// first is the main one, measured FanOutReps times, the others
	// FanOutExtraReps times.
	FanOutVariants  []string `json:"fan_out_variants"`
	FanOutExtraReps int      `json:"fan_out_extra_reps"`
	FanOutMemMiB    int      `json:"fan_out_mem_mib"`
	VolumeMiB       int      `json:"volume_mib"`
	VolumeReps      int      `json:"volume_reps"`
	FilesOnlyMemMiB int      `json:"files_only_mem_mib"`
	KSMMemMiB       int      `json:"ksm_mem_mib"`
	KSMWindowS      float64  `json:"ksm_window_s"`
	ProxyReps       int      `json:"proxy_reps"`
	BranchMemMiB    int      `json:"branch_mem_mib"`
	BranchReps      int      `json:"branch_reps"`
	// CRIMemMiB sizes the source forked through Podman and through
	// containerd's CRI (0: none), CRIReps its warm rounds.
	CRIMemMiB int `json:"cri_mem_mib"`
	CRIReps   int `json:"cri_reps"`
	// ThroughputMemMiB sizes the throughput sources (0: none);
	// ThroughputReps forks each is given per memory mode, watched for
	// ThroughputWindowS after the fork returned.
	ThroughputMemMiB  int     `json:"throughput_mem_mib"`
	ThroughputReps    int     `json:"throughput_reps"`
	ThroughputWindowS float64 `json:"throughput_window_s"`
	LaterDelayS       float64 `json:"later_delay_s"`
	ArchiveDir        string  `json:"archive_dir"`
	CriuImageDir      string  `json:"criu_image_dir"`
}

// Failure is one measurement that failed.
type Failure struct {
	Workload string `json:"workload"`
	Method   string `json:"method"`
	Rep      int    `json:"rep"`
	Error    string `json:"error"`
}

// WorkloadResult holds every method's measurements of one workload.
type WorkloadResult struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"` // procs, mem, workspace
	Procs  int    `json:"procs"`
	MemMiB int    `json:"mem_mib"`
	// Description says what runs in the container.
	Description string                   `json:"description"`
	Methods     map[string]*MethodResult `json:"methods"`
	// Ratios compare warm medians; see ratioDefs.
	Ratios map[string]float64 `json:"ratios"`
}

// MethodResult is one method on one workload.
type MethodResult struct {
	Method string `json:"method"`
	// NotMeasured says why this method was not run on this workload.
	NotMeasured string `json:"not_measured,omitempty"`
	// IdleGapMs is the observer's largest gap over one second with no fork:
	// the noise floor of observer_gap_ms.
	IdleGapMs float64 `json:"idle_gap_ms,omitempty"`
	// RestoreRuntimes lists the runtimes that made this method's copies,
	// from its samples.
	RestoreRuntimes []string  `json:"restore_runtimes,omitempty"`
	Samples         []*Sample `json:"samples"`
	// Cold is the first fork after the source started; Warm summarises the
	// others.
	Cold  map[string]float64 `json:"cold"`
	Warm  map[string]Stat    `json:"warm"`
	Later *LaterMem          `json:"later,omitempty"`
}

// Sample is one fork (one repetition).
type Sample struct {
	Rep     int    `json:"rep"`
	Cold    bool   `json:"cold"`
	Sibling string `json:"sibling,omitempty"`
	// RestoreRuntime is what made the copy: the OCI runtime Podman
	// recorded for the restored container (podman inspect .OCIRuntime), or
	// "criu" for raw CRIU.
	RestoreRuntime string             `json:"restore_runtime,omitempty"`
	Metrics        map[string]float64 `json:"metrics"`
}

// LaterMem is memory of the source and of the cold fork's sibling some
// time after that fork.
type LaterMem struct {
	AfterS  float64  `json:"after_s"`
	Source  MemUsage `json:"source"`
	Sibling MemUsage `json:"sibling"`
}

// Stat summarises samples.
type Stat struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// FanOutResult is the fan-out experiment: one capture, N siblings, in
// each of several variants.
type FanOutResult struct {
	Workload string           `json:"workload"`
	Variants []*FanOutVariant `json:"variants"`
	Failures int              `json:"failures"`
}

// FanOutVariant is the fan-out with one --memory and one --parallel.
type FanOutVariant struct {
	// Name is memory:parallel as configured (parallel 0: podman-fork's
	// default).
	Name   string `json:"name"`
	Memory string `json:"memory"`
	// Parallel is the --parallel given (0: none, podman-fork's default);
	// ParallelUsed what that means on this machine.
	Parallel     int            `json:"parallel"`
	ParallelUsed int            `json:"parallel_used"`
	Reps         int            `json:"reps"`
	Counts       []*FanOutCount `json:"counts"`
	// MarginalMsPerChild is the least-squares slope of the total time to
	// all siblings running against the number of siblings.
	MarginalMsPerChild float64 `json:"marginal_ms_per_child"`
	// MarginalPairs are (T(n) - T(1)) / (n - 1) from medians of the time
	// to all siblings running; MarginalOverFirst the same over T(1).
	MarginalPairs     map[string]float64 `json:"marginal_pairs"`
	MarginalOverFirst map[string]float64 `json:"marginal_over_first"`
}

// FanOutCount is one sibling count.
type FanOutCount struct {
	Count   int             `json:"count"`
	Samples []*Sample       `json:"samples"`
	Summary map[string]Stat `json:"summary"`
}

// ForkRefResult is fork() of one process that touched MemMiB MiB of
// private anonymous memory, the child exiting at once, timed Reps times.
type ForkRefResult struct {
	MemMiB   int       `json:"mem_mib"`
	RssKiB   int64     `json:"rss_kib"`
	TouchMs  float64   `json:"touch_ms"`
	ForkMs   []float64 `json:"fork_ms"`
	MedianMs float64   `json:"median_ms"`
	// RewriteAfterForkMs is how long the process then took to rewrite all
	// its memory, a whole page at a time, right after one more fork()
	// whose child was gone (each first write traps to take its page
	// back); RewriteMs the same rewrite again, with no fork() before it.
	RewriteAfterForkMs float64 `json:"rewrite_after_fork_ms"`
	RewriteMs          float64 `json:"rewrite_ms"`
	// Error is why it could not be measured ("" when it was).
	Error string `json:"error,omitempty"`
}

// Headline is what the closing note quotes.
type Headline struct {
	// MemWorkload is the memory-sweep workload the ratios are taken at
	// (mem-1024 in a full run).
	MemWorkload string `json:"mem_workload"`
	// Warm medians at MemWorkload, and in Cold the cold (first) fork's
	// values, which can differ a lot: the headline shows both.
	HeadlineValues
	Cold HeadlineValues `json:"cold"`
	// Warm ranges (min, max) at MemWorkload: a median hides a drift over
	// the repetitions.
	TclonePauseRange [2]float64 `json:"tclone_pause_range_ms"`
	PodmanPauseRange [2]float64 `json:"podman_pause_range_ms"`
	// Least-squares slopes over the process-count sweep (warm medians).
	TcloneMsPerProcess      float64 `json:"tclone_ms_per_process"`
	TclonePauseMsPerProcess float64 `json:"tclone_pause_ms_per_process"`
	PodmanMsPerProcess      float64 `json:"podman_ms_per_process"`
	// The same for --memory twin (0 when the sweep did not measure it).
	TwinMsPerProcess      float64 `json:"twin_ms_per_process"`
	TwinPauseMsPerProcess float64 `json:"twin_pause_ms_per_process"`
	// MarginalMsPerChild is the fan-out's marginal cost per extra sibling
	// (its main variant).
	MarginalMsPerChild float64 `json:"marginal_ms_per_child"`
	// Lazy and LazyCold are the headline's numbers with tclone's
	// --memory lazy in place of copy (at MemWorkload, against the same
	// stock Podman samples).
	Lazy     HeadlineValues `json:"lazy"`
	LazyCold HeadlineValues `json:"lazy_cold"`
	// Twin and TwinCold are the same with --memory twin.
	Twin     HeadlineValues `json:"twin"`
	TwinCold HeadlineValues `json:"twin_cold"`
	// Targets are the ratios, each with its bound.
	Targets []Target `json:"targets"`
}

// Target is one of the ratios, from this run's warm medians.
type Target struct {
	Key   string `json:"key"`
	Title string `json:"title"`
	// Status: met, not met (measured against the bound), no bound
	// (reported only), other size (the run had no workload of the
	// issue's size: computed at another, not comparable), not measured
	// (an input is missing).
	Status string  `json:"status"`
	Value  float64 `json:"value"`
	// Bound is the largest value that meets the target (0: none).
	Bound     float64 `json:"bound"`
	BoundText string  `json:"bound_text"`
	// Detail gives the numbers the ratio is made of.
	Detail string `json:"detail"`
	// Difference marks a value that is a difference, not a ratio: it can
	// be 0 or below and still be measured.
	Difference bool `json:"difference,omitempty"`
}

// Target statuses.
const (
	TargetMet         = "met"
	TargetNotMet      = "not met"
	TargetNoBound     = "no bound"
	TargetOtherSize   = "other size"
	TargetNotMeasured = "not measured"
)

// HeadlineValues are the headline's numbers for one kind of fork, warm or
// cold.
type HeadlineValues struct {
	TclonePauseMs        float64 `json:"tclone_pause_ms"`
	PodmanPauseMs        float64 `json:"podman_pause_ms"`
	TcloneGapMs          float64 `json:"tclone_observer_gap_ms"`
	PodmanGapMs          float64 `json:"podman_observer_gap_ms"`
	TcloneFirstCommandMs float64 `json:"tclone_first_command_ms"`
	PodmanFirstCommandMs float64 `json:"podman_first_command_ms"`
	PauseRatio           float64 `json:"pause_ratio_podman_over_tclone"`
	GapRatio             float64 `json:"observer_gap_ratio_podman_over_tclone"`
	FirstCommandRatio    float64 `json:"first_command_ratio_podman_over_tclone"`
}

// summarize fills Cold and Warm from the samples.
func (m *MethodResult) summarize() {
	m.Cold = map[string]float64{}
	m.RestoreRuntimes = nil
	for _, s := range m.Samples {
		if s.RestoreRuntime != "" && !slices.Contains(m.RestoreRuntimes, s.RestoreRuntime) {
			m.RestoreRuntimes = append(m.RestoreRuntimes, s.RestoreRuntime)
		}
	}
	warm := map[string][]float64{}
	for _, s := range m.Samples {
		if s.Cold {
			for k, v := range s.Metrics {
				m.Cold[k] = v
			}
			continue
		}
		for k, v := range s.Metrics {
			warm[k] = append(warm[k], v)
		}
	}
	m.Warm = summarizeAll(warm)
}

// summarizeWarm summarises the metrics of the samples that are not cold.
func summarizeWarm(samples []*Sample) map[string]Stat {
	vals := map[string][]float64{}
	for _, s := range samples {
		if s.Cold {
			continue
		}
		for k, v := range s.Metrics {
			vals[k] = append(vals[k], v)
		}
	}
	return summarizeAll(vals)
}

func summarizeAll(vals map[string][]float64) map[string]Stat {
	out := map[string]Stat{}
	for k, v := range vals {
		out[k] = summarize(v)
	}
	return out
}

func summarize(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return Stat{N: len(s), Median: quantile(s, 0.5), P95: quantile(s, 0.95), Min: s[0], Max: s[len(s)-1]}
}

// quantile interpolates linearly between order statistics (numpy's
// default). With 5 samples p95 lies 80% of the way from the 4th to the 5th.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// slope is the least-squares slope of y against x.
func slope(x, y []float64) float64 {
	n := float64(len(x))
	if len(x) < 2 || len(x) != len(y) {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / d
}

// The accessors below take a nil m, a method a workload did not run, as
// one with no samples.

// coldValue returns the cold fork's metric, or NaN.
func (m *MethodResult) coldValue(metric string) float64 {
	if m == nil {
		return math.NaN()
	}
	v, ok := m.Cold[metric]
	if !ok {
		return math.NaN()
	}
	return v
}

// warmStat returns the warm summary of metric, and whether it has samples.
func (m *MethodResult) warmStat(metric string) (Stat, bool) {
	if m == nil {
		return Stat{}, false
	}
	st, ok := m.Warm[metric]
	return st, ok && st.N > 0
}

// warmMedian returns the warm median of metric, or NaN.
func (m *MethodResult) warmMedian(metric string) float64 {
	if st, ok := m.warmStat(metric); ok {
		return st.Median
	}
	return math.NaN()
}

// warmRange returns the smallest and largest warm value of metric.
func (m *MethodResult) warmRange(metric string) [2]float64 {
	if st, ok := m.warmStat(metric); ok {
		return [2]float64{st.Min, st.Max}
	}
	return [2]float64{math.NaN(), math.NaN()}
}

// ratioDef is one ratio of warm medians: num's metric over den's.
type ratioDef struct {
	Key, NumMethod, NumMetric, DenMethod, DenMetric, Title string
}

// ratioDefs are the ratios computed for every workload. "x_over_tclone"
// above 1 means tclone is that many times faster; "tclone_over_fork" is how
// many times the fork() floor tclone takes.
var ratioDefs = []ratioDef{
	{"podman_over_tclone_pause", MethodPodman, "pause_ms", MethodTclone, "pause_ms", "source pause (measured by the runtime/CRIU), stock Podman / tclone"},
	{"podman_over_tclone_observer_gap", MethodPodman, "observer_gap_ms", MethodTclone, "observer_gap_ms", "largest gap seen inside the source, stock Podman / tclone"},
	{"podman_over_tclone_to_running", MethodPodman, "to_running_ms", MethodTclone, "to_running_ms", "time to the sibling running, stock Podman / tclone"},
	{"podman_over_tclone_first_command", MethodPodman, "first_command_ms", MethodTclone, "first_command_ms", "time to the first command answered in the sibling, stock Podman / tclone"},
	{"criu_over_tclone_pause", MethodCriu, "pause_ms", MethodTclone, "pause_ms", "source pause, raw CRIU / tclone"},
	{"criu_over_tclone_observer_gap", MethodCriu, "observer_gap_ms", MethodTclone, "observer_gap_ms", "observer gap, raw CRIU / tclone"},
	{"criu_over_tclone_to_running", MethodCriu, "to_running_ms", MethodTclone, "to_running_ms", "time to the copy running, raw CRIU / tclone"},
	{"tclone_over_fork_pause", MethodTclone, "pause_ms", MethodFork, "floor_ms", "tclone source pause / fork() floor"},
	{"tclone_over_fork_to_running", MethodTclone, "to_running_ms", MethodFork, "floor_ms", "tclone time to running / fork() floor"},
	{"podman_over_tclone_sibling_pss", MethodPodman, "sibling_pss_kib", MethodTclone, "sibling_pss_kib", "sibling PSS right after, stock Podman / tclone"},
	{"podman_over_tclone_lazy_to_running", MethodPodman, "to_running_ms", MethodTcloneLazy, "to_running_ms", "time to the sibling running, stock Podman / tclone lazy"},
	{"podman_over_tclone_lazy_first_command", MethodPodman, "first_command_ms", MethodTcloneLazy, "first_command_ms", "time to the first command, stock Podman / tclone lazy"},
	{"tclone_over_tclone_lazy_first_command", MethodTclone, "first_command_ms", MethodTcloneLazy, "first_command_ms", "time to the first command, tclone copy / tclone lazy"},
	{"tclone_over_tclone_lazy_pause", MethodTclone, "pause_ms", MethodTcloneLazy, "pause_ms", "source pause, tclone copy / tclone lazy"},
	{"podman_over_tclone_twin_to_running", MethodPodman, "to_running_ms", MethodTcloneTwin, "to_running_ms", "time to the sibling running, stock Podman / tclone twin"},
	{"podman_over_tclone_twin_first_command", MethodPodman, "first_command_ms", MethodTcloneTwin, "first_command_ms", "time to the first command, stock Podman / tclone twin"},
	{"tclone_over_tclone_twin_pause", MethodTclone, "pause_ms", MethodTcloneTwin, "pause_ms", "source pause, tclone copy / tclone twin"},
	{"tclone_twin_over_fork_pause", MethodTcloneTwin, "pause_ms", MethodFork, "floor_ms", "tclone twin source pause / fork() floor"},
}

// lazyRatios are the ratioDefs that need the lazy method.
var lazyRatios = []string{"podman_over_tclone_lazy_to_running", "podman_over_tclone_lazy_first_command",
	"tclone_over_tclone_lazy_first_command", "tclone_over_tclone_lazy_pause"}

// twinRatios are the ratioDefs that need the twin method.
var twinRatios = []string{"podman_over_tclone_twin_to_running", "podman_over_tclone_twin_first_command",
	"tclone_over_tclone_twin_pause", "tclone_twin_over_fork_pause"}

func (w *WorkloadResult) computeRatios() {
	w.Ratios = map[string]float64{}
	for _, d := range ratioDefs {
		num := w.Methods[d.NumMethod].warmMedian(d.NumMetric)
		den := w.Methods[d.DenMethod].warmMedian(d.DenMetric)
		if math.IsNaN(num) || math.IsNaN(den) || den <= 0 {
			continue
		}
		w.Ratios[d.Key] = num / den
	}
}
