package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeRun is a run of one 1 GiB memory workload, tclone copy, lazy and
// twin and stock Podman, one cold and two warm forks each, with the given
// stock restore runtime.
func fakeRun(stockRT string) *Results {
	w := &WorkloadResult{Name: "mem-1024", Kind: "mem", MemMiB: 1024, Procs: 4, Methods: map[string]*MethodResult{}}
	for _, c := range []struct {
		method, rt string
		pauses     []float64
	}{
		{MethodTclone, "tclone", []float64{900, 800, 820}},
		{MethodTcloneLazy, "tclone", []float64{880, 790, 810}},
		{MethodTcloneTwin, "tclone", []float64{90, 60, 70}},
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
		"| ms | tclone copy cold | tclone copy warm | tclone lazy cold | tclone lazy warm | tclone twin cold | tclone twin warm | stock Podman cold | stock Podman warm | stock / copy cold | stock / copy warm | stock / lazy cold | stock / lazy warm | stock / twin cold | stock / twin warm |",
		"| source pause, measured by the runtime | 900 | 810 | 880 | 800 | 90.0 | 65.0 | 700 | 2248 | **0.78×** | **2.77×** | **0.80×** | **2.81×** | **7.78×** | **34.6×** |",
		"from 1207 to 3288 ms for stock Podman",
		"restored by `tclone` (tclone copy), `tclone` (tclone lazy), `tclone` (tclone twin) and `crun` (stock Podman)",
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

// fakeMem is a memory workload whose warm forks all took the given first
// command and pause times, per method.
func fakeMem(mib int, firstCommand, pause map[string]float64) *WorkloadResult {
	w := &WorkloadResult{Name: fmt.Sprintf("mem-%d", mib), Kind: "mem", MemMiB: mib, Methods: map[string]*MethodResult{}}
	for meth, fc := range firstCommand {
		mr := &MethodResult{Method: meth}
		for i := range 3 {
			mr.Samples = append(mr.Samples, &Sample{Rep: i, Cold: i == 0, Metrics: map[string]float64{
				"first_command_ms": fc, "pause_ms": pause[meth], "to_running_ms": fc - 100, "cli_exec_ms": 200}})
		}
		mr.summarize()
		w.Methods[meth] = mr
	}
	return w
}

func findTarget(t *testing.T, ts []Target, key string) Target {
	t.Helper()
	for _, x := range ts {
		if x.Key == key {
			return x
		}
	}
	t.Fatalf("no target %s in %+v", key, ts)
	return Target{}
}

// The targets are computed at the sizes and judged against their
// bounds; at other sizes they are computed but never called met.
func TestTargets(t *testing.T) {
	r := &Results{Workloads: []*WorkloadResult{
		fakeMem(0, map[string]float64{MethodTclone: 600, MethodTcloneLazy: 500, MethodPodman: 700}, map[string]float64{MethodTclone: 100, MethodTcloneLazy: 100}),
		fakeMem(1024, map[string]float64{MethodTclone: 1500, MethodTcloneLazy: 1000, MethodPodman: 6000}, map[string]float64{MethodTclone: 600, MethodTcloneLazy: 500}),
		fakeMem(2048, map[string]float64{MethodTclone: 3000, MethodTcloneLazy: 1300, MethodPodman: 12000}, map[string]float64{MethodTclone: 1200, MethodTcloneLazy: 1000}),
	}}
	fv := &FanOutVariant{Name: "lazy:0", Memory: "lazy", ParallelUsed: 2, MarginalPairs: map[string]float64{}, MarginalOverFirst: map[string]float64{}}
	for _, c := range []struct {
		n  int
		ms []float64
	}{{1, []float64{1000, 1000}}, {4, []float64{1600, 1600}}, {16, []float64{4000, 4000}}} {
		fc := &FanOutCount{Count: c.n}
		for _, v := range c.ms {
			fc.Samples = append(fc.Samples, &Sample{Metrics: map[string]float64{"to_running_ms": v}})
		}
		fc.Summary = summarizeAll(map[string][]float64{"to_running_ms": c.ms})
		fv.Counts = append(fv.Counts, fc)
	}
	fv.marginal()
	r.FanOut = &FanOutResult{Variants: []*FanOutVariant{fv}}
	ts := targets(r)
	for _, c := range []struct {
		key, status string
		value       float64
	}{
		{"first_command_1g_lazy_over_stock", TargetMet, 1000.0 / 6000},
		{"first_command_1g_copy_over_stock", TargetNotMet, 1500.0 / 6000},
		{"first_command_2g_lazy_over_stock", TargetMet, 1300.0 / 12000},
		{"first_command_2g_copy_over_stock", TargetNotMet, 3000.0 / 12000},
		// 1300 <= 1.5 × 500 + (1000 − 100) = 1650.
		{"first_command_2g_over_0_lazy", TargetMet, 1300.0 / 500},
		{"fanout_marginal_over_first_lazy:0", TargetMet, 200.0 / 1000},
		{"pause_1g_copy_over_lazy", TargetNoBound, 600.0 / 500},
	} {
		got := findTarget(t, ts, c.key)
		if got.Status != c.status || math.Abs(got.Value-c.value) > 1e-9 {
			t.Errorf("%s: %s %v, want %s %v (%+v)", c.key, got.Status, got.Value, c.status, c.value, got)
		}
	}
	if b := findTarget(t, ts, "first_command_2g_over_0_lazy").Bound; math.Abs(b-1650.0/500) > 1e-9 {
		t.Errorf("2 GiB over 0 bound %v, want %v", b, 1650.0/500)
	}
	if d := findTarget(t, ts, "first_command_1g_lazy_over_stock").Detail; !strings.Contains(d, "`podman exec` CLI call (200 ms)") || !strings.Contains(d, "0.18×") {
		t.Errorf("1 GiB detail %q lacks the CLI exec ratio (900 + 200) / 6000", d)
	}

	// A quick run's sizes: computed elsewhere, never met.
	q := &Results{Workloads: []*WorkloadResult{r.Workloads[0], fakeMem(32, map[string]float64{MethodTclone: 600, MethodTcloneLazy: 500, MethodPodman: 900}, map[string]float64{MethodTclone: 100, MethodTcloneLazy: 100})}}
	for _, x := range targets(q) {
		if x.Status == TargetMet || x.Status == TargetNotMet {
			t.Errorf("quick run: target %s judged %s at another size", x.Key, x.Status)
		}
	}
	if x := findTarget(t, targets(q), "first_command_1g_lazy_over_stock"); x.Status != TargetOtherSize || !strings.Contains(x.Detail, "mem-32") {
		t.Errorf("quick run 1 GiB target: %+v", x)
	}
}

// Targets whose status contradicts their value, or a missing one, are not
// well formed.
func TestValidateTargets(t *testing.T) {
	r := &Results{Config: RunConfig{MemMiBs: []int{1024}, LazyKinds: []string{"mem"}}}
	r.Workloads = []*WorkloadResult{fakeMem(1024, map[string]float64{MethodTclone: 1500, MethodTcloneLazy: 1000, MethodPodman: 6000}, map[string]float64{MethodTclone: 600, MethodTcloneLazy: 500})}
	r.Headline.Targets = targets(r)
	if p := validateTargets(r); len(p) != 0 {
		t.Fatalf("good targets flagged: %v", p)
	}
	r.Headline.Targets[0].Status = TargetNotMet
	r.Headline.Targets = r.Headline.Targets[:len(r.Headline.Targets)-1]
	p := strings.Join(validateTargets(r), "\n")
	for _, want := range []string{"does not agree", "targets ["} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q: %s", want, p)
		}
	}
}

func volumeVariantOf(name string, pauses []float64, copied, reflinked float64) *VolumeVariant {
	vals := map[string][]float64{"pause_ms": pauses}
	for range pauses {
		vals["copied_mib"] = append(vals["copied_mib"], copied)
		vals["reflinked_mib"] = append(vals["reflinked_mib"], reflinked)
	}
	return &VolumeVariant{Name: name, Mode: "copy", Summary: summarizeAll(vals)}
}

// The volume target is the pause reflink adds over share (which may be
// below zero within the noise, and is then met); the KSM target the
// lowest sibling PSS/RSS within 60 s; and validation catches a copy that
// did not reflink and ksmd settings not put back.
func TestForkModeTargets(t *testing.T) {
	r := &Results{Config: RunConfig{VolumeMiB: 1024, VolumeReps: 3, KSMMemMiB: 1024, KSMWindowS: 60, WarmReps: 1}}
	r.Volumes = &VolumeResult{SizeMiB: 1024, Variants: []*VolumeVariant{
		volumeVariantOf("share", []float64{80, 70, 90}, 0, 0),
		volumeVariantOf("copy", []float64{500, 520, 540}, 1024, 0),
		volumeVariantOf("reflink", []float64{75, 78, 76}, 1024, 1024),
	}}
	mem := func(rss, pss int64) MemUsage { return MemUsage{RssKiB: rss, PssKiB: pss} }
	r.KSM = &KSMResult{MemMiB: 1024, Restored: true, Points: []KSMPoint{
		{AtS: 0, Sibling: mem(1000, 1000)}, {AtS: 30, Sibling: mem(1000, 580)}, {AtS: 60, Sibling: mem(1000, 700)}, {AtS: 65, Sibling: mem(1000, 500)}}}
	ts := forkModeTargets(r)
	if v := findTarget(t, ts, "volume_reflink_added_pause_ms"); v.Status != TargetMet || v.Value != 76-80 {
		t.Errorf("volume target %+v, want met at -4 ms", v)
	}
	if k := findTarget(t, ts, "ksm_sibling_pss_over_rss_60s"); k.Status != TargetMet || k.Value != 0.58 {
		t.Errorf("ksm target %+v, want met at 0.58 (the 65 s point is outside the window)", k)
	}
	r.FilesOnly = &FilesOnlyResult{Sources: []*FilesOnlySource{
		{Workload: "a", Summary: summarizeAll(map[string][]float64{"pause_ms": {2}, "to_running_ms": {900}})},
		{Workload: "b", Summary: summarizeAll(map[string][]float64{"pause_ms": {3}, "to_running_ms": {950}})}}}
	if p := validateForkModes(r); len(p) != 0 {
		t.Fatalf("good fork modes flagged: %v", p)
	}
	r.Volumes.Variants[2] = volumeVariantOf("reflink", []float64{500, 510, 505}, 1024, 0)
	r.KSM.Restored = false
	p := strings.Join(validateForkModes(r), "\n")
	for _, want := range []string{"volume reflink: 0 MiB reflinked", "ksmd's settings were not put back"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q: %s", want, p)
		}
	}
}

// The proxy targets are the median added latency, met at or below 2 ms
// (below zero within the noise); a run that asked for the proxy and has
// no measurement of it, or one request unmeasured, fails validation.
func TestProxyTargets(t *testing.T) {
	st := func(v ...float64) Stat { return summarize(v) }
	r := &Results{Config: RunConfig{ProxyReps: 3, WarmReps: 1}, Proxy: &ProxyResult{Reps: 3, Requests: []*ProxyRequest{
		{Name: proxyRequests[0], Podman: st(1, 1.1, 1.2), Tclone: st(1.3, 1.4, 1.5), AddedMs: 0.3},
		{Name: proxyRequests[1], Podman: st(30, 31, 32), Tclone: st(33, 35, 36), AddedMs: 3.5},
	}}}
	r.FilesOnly = &FilesOnlyResult{Sources: []*FilesOnlySource{
		{Workload: "a", Summary: summarizeAll(map[string][]float64{"pause_ms": {2}, "to_running_ms": {900}})},
		{Workload: "b", Summary: summarizeAll(map[string][]float64{"pause_ms": {3}, "to_running_ms": {950}})}}}
	ts := forkModeTargets(r)
	if l := findTarget(t, ts, "rest_proxy_added_ms_list"); l.Status != TargetMet || l.Value != 0.3 {
		t.Errorf("list target %+v, want met at 0.3", l)
	}
	if e := findTarget(t, ts, "rest_proxy_added_ms_exec"); e.Status != TargetNotMet || e.Value != 3.5 {
		t.Errorf("exec target %+v, want not met at 3.5", e)
	}
	if p := validateForkModes(r); len(p) != 0 {
		t.Errorf("a good proxy run flagged: %v", p)
	}
	r.Proxy.Requests = r.Proxy.Requests[:1]
	if p := strings.Join(validateForkModes(r), "\n"); !strings.Contains(p, "rest proxy: 1 requests measured") {
		t.Errorf("a missing request not flagged: %s", p)
	}
	r.Proxy = nil
	if p := strings.Join(validateForkModes(r), "\n"); !strings.Contains(p, "rest proxy: not run") {
		t.Errorf("a missing proxy section not flagged: %s", p)
	}
}

// The branch targets: the pause ratio of medians, and the disk after five
// successive branches over one; a run missing rounds, starts or branches
// fails validation.
func TestBranchTargets(t *testing.T) {
	round := func(rep int, fork, branch float64) *Sample {
		return &Sample{Rep: rep, Cold: rep == 0, Metrics: map[string]float64{"fork_pause_ms": fork, "branch_pause_ms": branch, "durable_ms": 3000, "images_mib": 1030}}
	}
	samples := []*Sample{round(0, 500, 900), round(1, 100, 110), round(2, 120, 118)}
	br := &BranchResult{MemMiB: 1024, DirtyMiB: 20, Samples: samples, Summary: summarizeWarm(samples),
		Starts: []*BranchStart{{Count: 1, TotalMs: 900}, {Count: 4, TotalMs: 2000}}}
	for i, mib := range []float64{1030, 1052, 1075, 1097, 1120} {
		copied, fromBase := 20.5, 1004.0
		if i == 0 {
			copied, fromBase = 1024, 0
		}
		br.Successive = append(br.Successive, &BranchDisk{Index: i + 1, StoreMiB: mib, PauseMs: 150 - float64(i), CopiedMiB: copied, FromBaseMiB: fromBase})
	}
	br.Images = []*BranchImage{
		{Branch: "s-0", LayerMiB: 1040, PushedMiB: 500, ExportMs: 9000, PushMs: 30000, PullMs: 20000, ImportMs: 15000},
		{Branch: "s-1", LayerMiB: 1040, PushedMiB: 100, ExportMs: 9000, PushMs: 30000, PullMs: 20000, ImportMs: 15000},
	}
	r := &Results{Config: RunConfig{BranchMemMiB: 1024, BranchReps: 2}, Branches: br}
	ts := branchTargets(r)
	if im := findTarget(t, ts, "image_two_pushed_over_one"); im.Status != TargetMet || math.Abs(im.Value-1.2) > 1e-9 {
		t.Errorf("image target %+v, want met at 600/500", im)
	}
	br.Images[1].PushedMiB = 500
	if im := findTarget(t, branchTargets(r), "image_two_pushed_over_one"); im.Status != TargetNotMet {
		t.Errorf("a second image pushed whole: %+v", im)
	}
	if p := findTarget(t, ts, "branch_pause_over_fork_pause"); p.Status != TargetMet || math.Abs(p.Value-114.0/110) > 1e-9 {
		t.Errorf("pause target %+v, want met at 114/110", p)
	}
	if d := findTarget(t, ts, "branch_five_disk_over_one"); d.Status != TargetMet || math.Abs(d.Value-1120.0/1030) > 1e-9 {
		t.Errorf("disk target %+v, want met at 1120/1030", d)
	}
	if p := findTarget(t, ts, "branch_second_pause_over_first"); p.Status != TargetMet || math.Abs(p.Value-149.0/150) > 1e-9 {
		t.Errorf("second branch's pause target %+v, want met at 149/150", p)
	}
	if c := findTarget(t, ts, "branch_second_copied_over_first"); c.Status != TargetMet || math.Abs(c.Value-20.5/1024) > 1e-9 || !strings.Contains(c.Detail, "1004 MiB from the first") {
		t.Errorf("second branch's copy target %+v, want met at 20.5/1024", c)
	}
	if p := validateBranches(r); len(p) != 0 {
		t.Errorf("a good run flagged: %v", p)
	}
	br.Successive[1].CopiedMiB, br.Successive[1].PauseMs = 1024, 200
	for _, key := range []string{"branch_second_copied_over_first", "branch_second_pause_over_first"} {
		if c := findTarget(t, branchTargets(r), key); c.Status != TargetNotMet {
			t.Errorf("a second branch that copied everything in a longer pause: %s %+v", key, c)
		}
	}
	br.Successive[4].StoreMiB = 2100
	if d := findTarget(t, branchTargets(r), "branch_five_disk_over_one"); d.Status != TargetNotMet {
		t.Errorf("a store that doubled: %+v", d)
	}
	br.Images[1].PullMs = 0
	if p := strings.Join(validateBranches(r), "\n"); !strings.Contains(p, "checkpoint image of s-1") {
		t.Errorf("an image without its pull time not flagged: %s", p)
	}
	br.Images = br.Images[:1]
	if p := strings.Join(validateBranches(r), "\n"); !strings.Contains(p, "1 checkpoint images") {
		t.Errorf("a missing image not flagged: %s", p)
	}
	br.Starts = br.Starts[:1]
	if p := strings.Join(validateBranches(r), "\n"); !strings.Contains(p, "1 starts measured") {
		t.Errorf("a missing start not flagged: %s", p)
	}
	r.Branches = nil
	if p := strings.Join(validateBranches(r), "\n"); !strings.Contains(p, "branches: not run") {
		t.Errorf("a missing branches section not flagged: %s", p)
	}
}

// The CRI targets compare the two paths' warm medians, the pause by the
// source's observer; a run missing a round or a metric fails validation,
// and a smaller source is reported, not judged.
func TestCRITargets(t *testing.T) {
	round := func(rep int, podmanGap, criGap, podmanRun, criRun float64) *Sample {
		return &Sample{Rep: rep, Cold: rep == 0, Metrics: map[string]float64{
			"podman_pause_ms": podmanGap - 2, "podman_gap_ms": podmanGap, "podman_running_ms": podmanRun,
			"cri_pause_ms": criGap - 2, "cri_gap_ms": criGap, "cri_running_ms": criRun, "cri_checkpoint_ms": 300, "cri_restore_ms": 400}}
	}
	samples := []*Sample{round(0, 900, 2000, 3000, 9000), round(1, 150, 160, 500, 700), round(2, 150, 160, 500, 700)}
	cr := &CRIResult{MemMiB: 1024, PodmanMemory: "twin", CRIMemory: "twin", Samples: samples, Summary: summarizeWarm(samples)}
	r := &Results{Config: RunConfig{CRIMemMiB: 1024, CRIReps: 2}, CRI: cr}
	ts := criTargets(r)
	if p := findTarget(t, ts, "cri_pause_over_podman"); p.Status != TargetMet || math.Abs(p.Value-160.0/150) > 1e-9 {
		t.Errorf("pause target %+v, want met at 160/150", p)
	}
	if run := findTarget(t, ts, "cri_running_over_podman"); run.Status != TargetMet || math.Abs(run.Value-1.4) > 1e-9 {
		t.Errorf("running target %+v, want met at 700/500", run)
	}
	if p := validateCRI(r); len(p) != 0 {
		t.Errorf("a good run flagged: %v", p)
	}
	samples[1].Metrics["cri_gap_ms"], samples[2].Metrics["cri_gap_ms"] = 400, 400
	cr.Summary = summarizeWarm(samples)
	if p := findTarget(t, criTargets(r), "cri_pause_over_podman"); p.Status != TargetNotMet {
		t.Errorf("a CRI pause of 400 ms against 150: %+v", p)
	}
	cr.MemMiB = 16
	if p := findTarget(t, criTargets(r), "cri_pause_over_podman"); p.Status == TargetMet || p.Status == TargetNotMet {
		t.Errorf("a 16 MiB source judged: %+v", p)
	}
	delete(samples[2].Metrics, "cri_restore_ms")
	if p := strings.Join(validateCRI(r), "\n"); !strings.Contains(p, "cri round 2: cri_restore_ms") {
		t.Errorf("a missing metric not flagged: %s", p)
	}
	cr.CRIMemory = ""
	if p := strings.Join(validateCRI(r), "\n"); !strings.Contains(p, "memory modes") {
		t.Errorf("an unknown memory mode not flagged: %s", p)
	}
	cr.Samples = samples[:2]
	if p := strings.Join(validateCRI(r), "\n"); !strings.Contains(p, "2 rounds, want 3") {
		t.Errorf("a missing round not flagged: %s", p)
	}
	r.CRI = nil
	if p := strings.Join(validateCRI(r), "\n"); !strings.Contains(p, "cri: not run") {
		t.Errorf("a missing CRI section not flagged: %s", p)
	}
}

// The section make kernel-bench writes survives a bench run's rewrite of
// the file, once, before the failures.
func TestMarkdownKeepsKernelBenchSection(t *testing.T) {
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	section := vmSectionBegin + "\n## Copy-on-write in the VM\n\n| a | b |\n" + vmSectionEnd
	if err := os.WriteFile(md, []byte("# Benchmarks\n\nold\n\n"+section+"\n\n## Notes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := writeMarkdown(fakeRun(stockRuntime), md, dir); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(md)
	text := string(data)
	if strings.Count(text, section) != 1 || strings.Index(text, section) > strings.Index(text, "## Not measured, failures") {
		t.Fatalf("the kernel-bench section was not kept once, before the failures:\n%s", text)
	}
	if strings.Contains(text, "\nold\n") {
		t.Fatal("the old report was kept")
	}
}

// fakeProcs is a process-count workload of n processes whose warm forks
// with method all paused for pause ms.
func fakeProcs(n int, method string, pause float64) *WorkloadResult {
	w := &WorkloadResult{Name: fmt.Sprintf("procs-%d", n), Kind: "procs", Procs: n, Methods: map[string]*MethodResult{}}
	mr := &MethodResult{Method: method}
	for i := range 3 {
		mr.Samples = append(mr.Samples, &Sample{Rep: i, Cold: i == 0, Metrics: map[string]float64{"pause_ms": pause, "to_running_ms": 10 * pause}})
	}
	mr.summarize()
	w.Methods[method] = mr
	return w
}

func forkRef(mib int, ms ...float64) *ForkRefResult {
	return &ForkRefResult{MemMiB: mib, RssKiB: int64(mib)*1024 + 900, TouchMs: 700, ForkMs: ms, MedianMs: summarize(ms).Median,
		RewriteAfterForkMs: 3900, RewriteMs: 45}
}

// Issue 30's targets: the twin pause at 1 GiB within its pause at 0 MiB
// plus three fork() calls of 1 GiB, the first command against stock
// Podman, the pause's slope over the process count, each judged only at
// the sizes; the two the harness does not measure say so.
func TestTwinTargets(t *testing.T) {
	twinRun := func(pause1g float64, ref *ForkRefResult, procs []int, perProc float64) *Results {
		r := &Results{ForkRef: ref, Workloads: []*WorkloadResult{
			fakeMem(0, map[string]float64{MethodTcloneTwin: 500, MethodPodman: 700}, map[string]float64{MethodTcloneTwin: 50}),
			fakeMem(1024, map[string]float64{MethodTcloneTwin: 1000, MethodPodman: 6000}, map[string]float64{MethodTcloneTwin: pause1g}),
			fakeMem(2048, map[string]float64{MethodTcloneTwin: 2000, MethodPodman: 12000}, map[string]float64{MethodTcloneTwin: 300}),
		}}
		for _, n := range procs {
			r.Workloads = append(r.Workloads, fakeProcs(n, MethodTcloneTwin, 20+perProc*float64(n)))
		}
		return r
	}
	full := []int{1, 10, 50, 100, 200}
	for _, c := range []struct {
		name, key, status string
		r                 *Results
		value, bound      float64
	}{
		// 150 <= 50 + 3 × 40.
		{"within", "pause_1g_twin_within_fork", TargetMet, twinRun(150, forkRef(1024, 38, 40, 45), full, 1.5), 150, 170},
		{"over", "pause_1g_twin_within_fork", TargetNotMet, twinRun(200, forkRef(1024, 38, 40, 45), full, 1.5), 200, 170},
		{"fork of another size", "pause_1g_twin_within_fork", TargetOtherSize, twinRun(150, forkRef(32, 1, 2, 3), full, 1.5), 150, 56},
		{"no fork reference", "pause_1g_twin_within_fork", TargetNotMeasured, twinRun(150, nil, full, 1.5), 0, 0},
		{"1 GiB over stock", "first_command_1g_twin_over_stock", TargetMet, twinRun(150, nil, full, 1.5), 1000.0 / 6000, 1.0 / 5},
		{"2 GiB over stock", "first_command_2g_twin_over_stock", TargetNotMet, twinRun(150, nil, full, 1.5), 2000.0 / 12000, 1.0 / 8},
		{"slope within", "twin_pause_ms_per_process", TargetMet, twinRun(150, nil, full, 1.5), 1.5, 2},
		{"slope over", "twin_pause_ms_per_process", TargetNotMet, twinRun(150, nil, full, 3), 3, 2},
		{"slope of a short sweep", "twin_pause_ms_per_process", TargetOtherSize, twinRun(150, nil, []int{1, 10}, 1.5), 1.5, 2},
		{"no sweep", "twin_pause_ms_per_process", TargetNotMeasured, twinRun(150, nil, []int{10}, 1.5), 0, 2},
		{"throughput not run", "twin_source_throughput_after_thaw", TargetNotMeasured, twinRun(150, nil, full, 1.5), 0, 0},
	} {
		got := findTarget(t, targets(c.r), c.key)
		if got.Status != c.status || math.Abs(got.Value-c.value) > 1e-9 || math.Abs(got.Bound-c.bound) > 1e-9 {
			t.Errorf("%s: %s: %s %v (bound %v), want %s %v (bound %v): %+v", c.name, c.key, got.Status, got.Value, got.Bound, c.status, c.value, c.bound, got)
		}
		if got.Detail == "" {
			t.Errorf("%s: %s has no detail", c.name, c.key)
		}
	}
	if d := findTarget(t, targets(twinRun(150, forkRef(1024, 38, 40, 45), full, 1.5)), "pause_1g_twin_within_fork").Detail; !strings.Contains(d, "3 × 40.0 ms (fork() of 1 GiB, median of 3)") {
		t.Errorf("pause detail %q lacks the fork() reference", d)
	}
	withCriu := twinRun(150, nil, full, 3)
	for _, n := range full {
		raw := fakeProcs(n, MethodCriu, 10+2.5*float64(n))
		for _, w := range withCriu.Workloads {
			if w.Name == raw.Name {
				w.Methods[MethodCriu] = raw.Methods[MethodCriu]
			}
		}
	}
	if d := findTarget(t, targets(withCriu), "twin_pause_ms_per_process").Detail; !strings.Contains(d, "a bare `criu dump` of the same trees (raw CRIU dump/restore) in this run: 2.50 ms/process") {
		t.Errorf("slope detail %q lacks the bare CRIU dump's slope", d)
	}
	if d := findTarget(t, targets(twinRun(150, nil, full, 1.5)), "twin_pause_ms_per_process").Detail; strings.Contains(d, "criu dump") {
		t.Errorf("slope detail %q names a bare CRIU dump that was not measured", d)
	}

	// Every twin target is in a full run's list, and validation accepts
	// them; calling one that nothing measures met is caught.
	r := twinRun(150, forkRef(1024, 38, 40, 45), full, 1.5)
	r.Config = RunConfig{MemMiBs: []int{0, 1024, 2048}, ProcCounts: full, TwinKinds: []string{"procs", "mem"}, ForkRefMiB: 1024, ForkRefReps: 3}
	r.Headline.Targets = targets(r)
	for _, p := range validateTargets(r) {
		if strings.Contains(p, "twin") {
			t.Errorf("good twin targets flagged: %s", p)
		}
	}
	for i := range r.Headline.Targets {
		if r.Headline.Targets[i].Key == "pause_1g_twin_within_fork" {
			r.Headline.Targets[i].Status, r.Headline.Targets[i].Value = TargetNotMeasured, 0
		}
	}
	p := strings.Join(validateTargets(r), "\n")
	for _, want := range []string{"pause_1g_twin_within_fork: not measured, though the run has its workloads"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q: %s", want, p)
		}
	}
}

// The fork() reference must be there when asked for, with every fork
// timed and the median of its samples.
func TestValidateForkRef(t *testing.T) {
	cfg := RunConfig{ForkRefMiB: 1024, ForkRefReps: 3}
	for _, c := range []struct {
		name string
		ref  *ForkRefResult
		cfg  RunConfig
		want string
	}{
		{"good", forkRef(1024, 38, 40, 45), cfg, ""},
		{"skipped", nil, RunConfig{}, ""},
		{"missing", nil, cfg, "fork_ref: not run"},
		{"failed", &ForkRefResult{MemMiB: 1024, Error: "fork: ENOMEM"}, cfg, "fork_ref: failed: fork: ENOMEM"},
		{"short", forkRef(1024, 38, 40), cfg, "2 forks of 1024 MiB, want 3 of 1024 MiB"},
		{"bad median", &ForkRefResult{MemMiB: 1024, RssKiB: 1 << 21, ForkMs: []float64{38, 40, 45}, MedianMs: 41}, cfg, "median 41 ms does not match"},
		{"not touched", &ForkRefResult{MemMiB: 1024, RssKiB: 4000, ForkMs: []float64{38, 40, 45}, MedianMs: 40}, cfg, "held 4000 KiB"},
		{"unasked", forkRef(1024, 38, 40, 45), RunConfig{}, "measured, though fork_ref_mib is 0"},
		{"no rewrite", &ForkRefResult{MemMiB: 1024, RssKiB: 1 << 21, ForkMs: []float64{38, 40, 45}, MedianMs: 40}, cfg, "no rewrite times"},
	} {
		got := strings.Join(validateForkRef(&Results{Config: c.cfg, ForkRef: c.ref}), "\n")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: problems %q, want %q", c.name, got, c.want)
		}
	}
}

// A twin sample whose capture did not give every held process a twin (a
// capture that copied instead) is not well formed.
func TestValidateTwinSamples(t *testing.T) {
	mr := &MethodResult{Method: MethodTcloneTwin}
	for i := range 2 {
		m := map[string]float64{"twins": 10, "held_processes": 10}
		if i == 1 {
			m["twins"] = 0
		}
		mr.Samples = append(mr.Samples, &Sample{Rep: i, Cold: i == 0, RestoreRuntime: "tclone", Metrics: m})
	}
	mr.summarize()
	p := strings.Join(validateMethod("mem-1024", mr), "\n")
	if !strings.Contains(p, "rep 1: 0 twins for 10 held processes") || strings.Contains(p, "rep 0: 10 twins") {
		t.Errorf("twin counts: %s", p)
	}
	if !strings.Contains(p, "rep 0: first_command_ms missing") {
		t.Errorf("a twin sample without the tclone metrics passed: %s", p)
	}
}

// The markdown reports the twin method per process and per size, and the
// fork() reference.
func TestMarkdownTwin(t *testing.T) {
	r := fakeRun(stockRuntime)
	r.Workloads = append(r.Workloads, fakeProcs(1, MethodTcloneTwin, 21), fakeProcs(10, MethodTcloneTwin, 30))
	r.Config.TwinKinds = []string{"procs", "mem"}
	r.Config.ForkRefMiB, r.Config.ForkRefReps = 1024, 3
	r.ForkRef = forkRef(1024, 38, 40, 45)
	r.Headline = headline(r)
	if math.Abs(r.Headline.TwinPauseMsPerProcess-1) > 1e-9 {
		t.Fatalf("twin pause slope %v, want 1", r.Headline.TwinPauseMsPerProcess)
	}
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := writeMarkdown(r, md, dir); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(md)
	text := string(data)
	for _, want := range []string{
		"- Process count (`--memory twin`): 10.00 ms more per process to the sibling running, its source pause **1.00 ms more per process**. Source pause 21.0 ms with 1, 30.0 ms with 10 processes.",
		"took **40.0 ms** (median of 3; 38.0 to 45.0 ms)",
		"| mem-1024 | tclone fork, --memory twin | 65.0 (69.5) |",
		"stock/twin first command",
		"| source pause at 1 GiB, tclone fork, --memory twin, ms |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
}

func TestParseKinds(t *testing.T) {
	if k, err := parseKinds("--twin-kinds", "procs, mem"); err != nil || !slices.Equal(k, []string{"procs", "mem"}) {
		t.Errorf("procs, mem: %v %v", k, err)
	}
	if k, err := parseKinds("--twin-kinds", ""); err != nil || k == nil || len(k) != 0 {
		t.Errorf("empty: %#v %v", k, err)
	}
	for _, bad := range []string{"mem,mem", "vm"} {
		if _, err := parseKinds("--twin-kinds", bad); err == nil || !strings.Contains(err.Error(), "--twin-kinds") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
