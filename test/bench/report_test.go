package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRun is a run of one 1 GiB memory workload, tclone and stock Podman,
// one cold and two warm forks each, with the given stock restore runtime.
func fakeRun(stockRT string) *Results {
	w := &WorkloadResult{Name: "mem-1024", Kind: "mem", MemMiB: 1024, Procs: 4, Methods: map[string]*MethodResult{}}
	for _, c := range []struct {
		method, rt string
		pauses     []float64
	}{
		{MethodTclone, "tclone", []float64{900, 800, 820}},
		{MethodPodman, stockRT, []float64{700, 1207, 3288}},
	} {
		mr := &MethodResult{Method: c.method}
		for i, p := range c.pauses {
			mr.Samples = append(mr.Samples, &Sample{Rep: i, Cold: i == 0, RestoreRuntime: c.rt, Metrics: map[string]float64{
				"pause_ms": p, "observer_gap_ms": p + 1, "first_command_ms": 10 * p,
			}})
		}
		mr.summarize()
		w.Methods[c.method] = mr
	}
	r := &Results{Schema: SchemaVersion, Workloads: []*WorkloadResult{w}}
	r.Headline = headline(r)
	return r
}

// The headline puts the cold fork next to the warm median, and says which
// runtime made each method's copies.
func TestHeadlineShowsColdAndWarm(t *testing.T) {
	r := fakeRun(stockRuntime)
	h := r.Headline
	if h.Cold.PodmanPauseMs != 700 || h.PodmanPauseMs != (1207+3288)/2.0 || h.PodmanPauseRange != [2]float64{1207, 3288} {
		t.Fatalf("headline %+v", h)
	}
	if math.Abs(h.Cold.PauseRatio-700.0/900) > 1e-9 {
		t.Fatalf("cold ratio %v", h.Cold.PauseRatio)
	}
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := writeMarkdown(r, md, dir); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(md)
	text := string(data)
	for _, want := range []string{
		"| ms | tclone cold | tclone warm | stock Podman cold | stock Podman warm | stock / tclone cold | stock / tclone warm |",
		"| source pause, measured by the runtime | 900 | 810 | 700 | 2248 |",
		"from 1207 to 3288 ms for stock Podman",
		"restored by `tclone` (tclone) and `crun` (stock Podman)",
		"podman --runtime crun container restore --import",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
}

// A stock baseline that Podman restored with another runtime, or a sample
// that does not say, is not well formed.
func TestValidateRestoreRuntime(t *testing.T) {
	for _, rt := range []string{"tclone", ""} {
		r := fakeRun(rt)
		problems := strings.Join(validateMethod("mem-1024", r.Workloads[0].Methods[MethodPodman]), "\n")
		if !strings.Contains(problems, "want \"crun\"") {
			t.Errorf("stock restored by %q passed: %s", rt, problems)
		}
	}
	r := fakeRun(stockRuntime)
	if problems := strings.Join(validateMethod("mem-1024", r.Workloads[0].Methods[MethodPodman]), "\n"); strings.Contains(problems, "restored by") {
		t.Errorf("crun flagged: %s", problems)
	}
}
