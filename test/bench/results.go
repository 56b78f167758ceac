package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// SchemaVersion is the layout version of results.json. Version 2 records
// the runtime of every restore and the headline's cold numbers.
const SchemaVersion = 2

// Methods, in the order they are reported.
const (
	MethodTclone = "tclone"
	MethodPodman = "podman" // stock checkpoint --export + restore --import, crun
	MethodCriu   = "criu"   // raw criu dump --leave-running + criu restore
	MethodFork   = "fork"   // fork() of a process with the same anonymous RSS
)

var methodTitles = map[string]string{
	MethodTclone: "tclone fork",
	MethodPodman: "stock Podman checkpoint/restore (crun)",
	MethodCriu:   "raw CRIU dump/restore",
	MethodFork:   "fork() floor",
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
	Headline  Headline          `json:"headline"`
	// Failures lists every measurement that could not be made, with the
	// exact error.
	Failures []Failure `json:"failures"`
	Notes    []string  `json:"notes"`
}

// RunConfig is what the run was asked to do.
type RunConfig struct {
	WarmReps      int     `json:"warm_reps"`
	LargeWarmReps int     `json:"large_warm_reps"`
	LargeFromMiB  int     `json:"large_from_mib"`
	ProcCounts    []int   `json:"proc_counts"`
	MemMiBs       []int   `json:"mem_mibs"`
	MemProcs      int     `json:"mem_procs"`
	Workspace     bool    `json:"workspace"`
	WorkspaceMiB  int     `json:"workspace_mib"`
	FanOutCounts  []int   `json:"fan_out_counts"`
	FanOutReps    int     `json:"fan_out_reps"`
	FanOutMemMiB  int     `json:"fan_out_mem_mib"`
	LaterDelayS   float64 `json:"later_delay_s"`
	ArchiveDir    string  `json:"archive_dir"`
	CriuImageDir  string  `json:"criu_image_dir"`
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

// FanOutResult is the fan-out experiment: one capture, N siblings.
type FanOutResult struct {
	Workload string         `json:"workload"`
	Counts   []*FanOutCount `json:"counts"`
	// MarginalMsPerChild is the least-squares slope of the total time to
	// all siblings running against the number of siblings.
	MarginalMsPerChild float64 `json:"marginal_ms_per_child"`
	// MarginalPairs are (T(n) - T(1)) / (n - 1) from warm medians.
	MarginalPairs map[string]float64 `json:"marginal_pairs"`
	Failures      int                `json:"failures"`
}

// FanOutCount is one sibling count.
type FanOutCount struct {
	Count   int             `json:"count"`
	Samples []*Sample       `json:"samples"`
	Summary map[string]Stat `json:"summary"`
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
	// MarginalMsPerChild is the fan-out's marginal cost per extra sibling.
	MarginalMsPerChild float64 `json:"marginal_ms_per_child"`
}

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
}

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
