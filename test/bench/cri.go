package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

// CRIResult is one workload forked two ways, round by round on two sources
// that run it: a Podman container (`podman container fork`) and a pod's
// container under containerd's CRI, run by tclone as the runtime class
// tclone (`tclone kube fork`, whose capture containerd's CRI checkpoint
// asks for). Both sources' observers measure the pause each saw.
type CRIResult struct {
	Workload    string `json:"workload"`
	Description string `json:"description"`
	MemMiB      int    `json:"mem_mib"`
	Endpoint    string `json:"endpoint"`
	// PodmanMemory and CRIMemory are how each path's plan held memory
	// (the default, --memory auto, picks it).
	PodmanMemory string `json:"podman_memory"`
	CRIMemory    string `json:"cri_memory"`
	// Samples: podman_pause_ms and cri_pause_ms (tclone's capture, as
	// each path reports it), podman_gap_ms and cri_gap_ms (the source
	// observer's largest gap over the fork), podman_running_ms and
	// cri_running_ms (from the request until the sibling ran),
	// cri_checkpoint_ms (the CRI checkpoint call) and cri_restore_ms (the
	// sibling pod's run, restore and start).
	Samples []*Sample       `json:"samples"`
	Summary map[string]Stat `json:"summary"`
}

// kubeForkResult mirrors the JSON `tclone kube fork --format json` prints
// (shim/kubefork.Result).
type kubeForkResult struct {
	CheckpointMs   float64 `json:"checkpoint_ms"`
	CapturePauseMs float64 `json:"capture_pause_ms"`
	Memory         string  `json:"memory"`
	TotalMs        float64 `json:"total_ms"`
	Siblings       []struct {
		Name      string  `json:"name"`
		PodID     string  `json:"pod_id"`
		RestoreMs float64 `json:"restore_ms"`
	} `json:"siblings"`
}

// criForkedFrom is the label tclone kube fork puts on each sibling pod
// (shim/kubefork.LabelForkedFrom): the source container's ID.
const criForkedFrom = "io.tclone.forked-from"

// criPod is a pod of the run's under the CRI.
type criPod struct {
	name, id, ctrID string
	holder          holderRef
}

// crictl runs crictl against the run's CRI endpoint.
func (b *Bench) crictl(ctx context.Context, args ...string) (string, error) {
	out, _, err := runCmd(ctx, b.tools.Crictl, append([]string{"--runtime-endpoint", b.cfg.CRIEndpoint, "--image-endpoint", b.cfg.CRIEndpoint, "--timeout", "2m"}, args...)...)
	return strings.TrimSpace(out), err
}

func (b *Bench) runCRI(ctx context.Context) *CRIResult {
	w := memWorkload(b.cfg.CRIMemMiB, b.cfg.MemProcs)
	w.Name = "cri-" + w.Name
	cr := &CRIResult{Workload: w.Name, Description: w.Description, MemMiB: w.MemMiB, Endpoint: b.cfg.CRIEndpoint}
	fail := func(what string, rep int, err error) { b.fail(w.Name, "cri "+what, rep, err) }
	var err error
	if b.tools.Crictl, err = findTool("crictl", "/usr/local/bin/crictl"); err != nil {
		fail("crictl", -1, err)
		return cr
	}
	if _, err := b.crictl(ctx, "version"); err != nil {
		fail("containerd", -1, fmt.Errorf("no CRI runtime answers at %s (make bench starts tclone's containerd, hack/containerd.sh): %w", b.cfg.CRIEndpoint, err))
		return cr
	}
	prefix := fmt.Sprintf("tcb-%s-cri", b.runID)
	psrc, err := b.startSource(ctx, w, prefix+"-podman-src", "tclone")
	defer b.removeContainers(prefix + "-podman-src")
	if err != nil {
		fail("podman source", -1, err)
		return cr
	}
	ksrc, err := b.startPodSource(ctx, w, prefix+"-pod-src")
	if ksrc != nil {
		defer b.removePods(ksrc.id)
	}
	if err != nil {
		fail("pod source", -1, err)
		return cr
	}

	for rep := 0; rep <= b.cfg.CRIReps && ctx.Err() == nil; rep++ {
		s := &Sample{Rep: rep, Cold: rep == 0, Metrics: map[string]float64{}}
		// Alternate which goes first.
		for k := range 2 {
			if (rep+k)%2 == 0 {
				if err := b.criPodmanFork(ctx, psrc, fmt.Sprintf("%s-sib%d", prefix, rep), s, cr); err != nil {
					fail("podman fork", rep, err)
				}
			} else if err := b.criKubeFork(ctx, ksrc, fmt.Sprintf("%s-pod%d", prefix, rep), s, cr); err != nil {
				fail("kube fork", rep, err)
			}
		}
		cr.Samples = append(cr.Samples, s)
	}
	cr.Summary = summarizeWarm(cr.Samples)
	return cr
}

// criPodmanFork forks the Podman source once and removes the sibling.
func (b *Bench) criPodmanFork(ctx context.Context, src *Source, sib string, s *Sample, cr *CRIResult) error {
	if _, err := src.Holder.poke(ctx); err != nil {
		return err
	}
	b.track(sib)
	defer b.removeContainers(sib)
	st, _, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, stats: true})
	if err != nil {
		return err
	}
	gap, err := src.Holder.poke(ctx)
	if err != nil {
		return err
	}
	s.Metrics["podman_pause_ms"] = st.SourcePauseMs
	s.Metrics["podman_gap_ms"] = gap.MaxGapMs
	s.Metrics["podman_running_ms"] = st.Siblings[0].RunningMs
	cr.PodmanMemory = string(st.Capture.Memory)
	return nil
}

// criKubeFork forks the pod source once through the CRI and removes the
// sibling pod.
func (b *Bench) criKubeFork(ctx context.Context, src *criPod, name string, s *Sample, cr *CRIResult) error {
	if _, err := src.holder.poke(ctx); err != nil {
		return err
	}
	// A failed fork removes its pods; a made one is removed here, by the
	// label its pods carry should the output be unreadable.
	defer b.removeForkedPods(src.ctrID)
	out, _, err := runCmd(ctx, b.tools.Tclone, "kube", "fork", "--runtime-endpoint", b.cfg.CRIEndpoint, "--crictl", b.tools.Crictl,
		"--format", "json", "--name", name, src.name)
	if err != nil {
		return err
	}
	var res kubeForkResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Siblings) != 1 {
		return fmt.Errorf("decoding tclone kube fork's output: %v: %s", err, tail(out, 300))
	}
	gap, err := src.holder.poke(ctx)
	if err != nil {
		return err
	}
	s.Metrics["cri_pause_ms"] = res.CapturePauseMs
	s.Metrics["cri_gap_ms"] = gap.MaxGapMs
	s.Metrics["cri_running_ms"] = res.TotalMs
	s.Metrics["cri_checkpoint_ms"] = res.CheckpointMs
	s.Metrics["cri_restore_ms"] = res.Siblings[0].RestoreMs
	cr.CRIMemory = res.Memory
	return nil
}

// startPodSource runs w as the container of a pod named name under the
// CRI's runtime class tclone, as the kubelet would run it (its own PID
// namespace, a log directory, the kubelet's labels), and waits for its
// observer.
func (b *Bench) startPodSource(ctx context.Context, w Workload, name string) (*criPod, error) {
	if _, err := b.crictl(ctx, "pull", b.cfg.CRIImage); err != nil {
		return nil, fmt.Errorf("pulling %s (hack/registry.sh pushes it): %w", b.cfg.CRIImage, err)
	}
	uid := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	logs := filepath.Join(b.tmp, "pods", uid)
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	labels := map[string]any{"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid, "io.kubernetes.pod.namespace": "default", "io.tclone.bench": b.runID}
	pidNS := map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1}}}
	env := []map[string]string{}
	for _, e := range w.Env {
		k, v, _ := strings.Cut(e, "=")
		env = append(env, map[string]string{"key": k, "value": v})
	}
	pod := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid},
		"hostname": name, "log_directory": logs, "labels": labels, "linux": pidNS,
	}
	ctr := map[string]any{
		"metadata": map[string]any{"name": "main"},
		"image":    map[string]any{"image": b.cfg.CRIImage},
		"command":  w.Cmd, "envs": env, "log_path": "main/0.log",
		"labels": map[string]any{"io.kubernetes.pod.name": name, "io.kubernetes.container.name": "main"},
		"mounts": []map[string]any{{"container_path": "/holder", "host_path": b.tools.Holder, "readonly": true}},
		"linux":  pidNS,
	}
	podFile, ctrFile := filepath.Join(b.tmp, name+"-pod.json"), filepath.Join(b.tmp, name+"-ctr.json")
	for path, v := range map[string]any{podFile: pod, ctrFile: ctr} {
		data, _ := json.Marshal(v)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	id, err := b.crictl(ctx, "runp", "--runtime", "tclone", podFile)
	if err != nil {
		return nil, err
	}
	p := &criPod{id: id, name: name}
	if p.ctrID, err = b.crictl(ctx, "create", id, ctrFile, podFile); err != nil {
		return p, err
	}
	b.mu.Lock()
	b.sourceIDs = append(b.sourceIDs, p.ctrID)
	b.mu.Unlock()
	if _, err := b.crictl(ctx, "start", p.ctrID); err != nil {
		return p, err
	}
	var ci struct {
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	out, err := b.crictl(ctx, "inspect", "-o", "json", p.ctrID)
	if err == nil {
		err = json.Unmarshal([]byte(out), &ci)
	}
	if err != nil || ci.Info.Pid <= 0 {
		return p, fmt.Errorf("the pod's container has no init pid (crictl inspect: %v)", err)
	}
	report := filepath.Join(fmt.Sprintf("/proc/%d/root", ci.Info.Pid), holderreport.Path)
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(report); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logs, _ := b.crictl(context.Background(), "logs", "--tail", "20", p.ctrID)
			return p, fmt.Errorf("%s: the observer's report did not appear within 3 minutes; logs: %s", name, tail(logs, 800))
		}
	}
	hp, err := findHolder(ci.Info.Pid)
	if err != nil {
		return p, err
	}
	p.holder = holderRef{pid: hp, report: report}
	sleepCtx(ctx, w.Settle)
	return p, nil
}

// removeForkedPods removes the pods forked from the container ctrID.
func (b *Bench) removeForkedPods(ctrID string) {
	out, _ := b.crictl(context.Background(), "pods", "-q", "--label", criForkedFrom+"="+ctrID)
	b.removePods(strings.Fields(out)...)
}

// removePods stops and removes pods (and their containers), and first the
// pods forked from their containers.
func (b *Bench) removePods(ids ...string) {
	ctx := context.Background()
	for _, id := range ids {
		ctrs, _ := b.crictl(ctx, "ps", "-a", "-q", "--pod", id)
		for _, c := range strings.Fields(ctrs) {
			b.removeForkedPods(c)
		}
		b.crictl(ctx, "stopp", id)
		b.crictl(ctx, "rmp", "--force", id)
	}
}

// criTargetKeys are the CRI fork's targets.
var criTargetKeys = []string{"cri_pause_over_podman", "cri_running_over_podman"}

func criTargets(r *Results) []Target {
	cr := r.CRI
	if cr == nil {
		return nil
	}
	exact := cr.MemMiB == 1024 && !r.Quick
	mr := &MethodResult{Warm: cr.Summary}
	pause := Target{Key: criTargetKeys[0], Bound: 1.25, BoundText: "≤ 1.25 (equal within noise)",
		Title: fmt.Sprintf("a CRI fork's source pause / a Podman fork's, %s source (the source's observer)", sizeText(cr.MemMiB)), Value: math.NaN()}
	if c, p := mr.warmMedian("cri_gap_ms"), mr.warmMedian("podman_gap_ms"); c > 0 && p > 0 {
		pause.Value = c / p
		pause.Detail = fmt.Sprintf("%s ms / %s ms, warm medians of %d rounds (tclone's capture: %s ms / %s ms)", fmtMs(c), fmtMs(p), r.Config.CRIReps,
			fmtMs(mr.warmMedian("cri_pause_ms")), fmtMs(mr.warmMedian("podman_pause_ms")))
	}
	judge(&pause, exact)
	running := Target{Key: criTargetKeys[1], Bound: 1.5, BoundText: "≤ 1.5",
		Title: fmt.Sprintf("a CRI fork's time until its pod runs / a Podman fork's until its container runs, %s source", sizeText(cr.MemMiB)), Value: math.NaN()}
	if c, p := mr.warmMedian("cri_running_ms"), mr.warmMedian("podman_running_ms"); c > 0 && p > 0 {
		running.Value = c / p
		running.Detail = fmt.Sprintf("%s ms / %s ms, warm medians of %d rounds", fmtMs(c), fmtMs(p), r.Config.CRIReps)
	}
	judge(&running, exact)
	return []Target{pause, running}
}

// writeCRI writes the CRI section through p.
func writeCRI(r *Results, p func(string, ...any)) {
	cr := r.CRI
	if cr == nil {
		return
	}
	p("## Forks through containerd's CRI\n\nSource: %s, twice: a Podman container run by tclone, and a pod's container under containerd's CRI (%s) with tclone as the runtime class's handler. Per round, `podman container fork --print-stats` of the first and `tclone kube fork --format json` of the second (which asks the CRI for a checkpoint, as the kubelet's checkpoint API does, and restores the sibling into a new pod), in alternating order; one cold round and %d warm ones. Both with the default memory (--memory auto: %s through Podman, %s through the CRI). Milliseconds, warm median (p95). The *observer* is the largest gap the source's 1 ms ticker saw over the fork: through the CRI the source is held twice, for tclone's capture and then, frozen again, for containerd's archive of its filesystem, and the observer sees the longer of the two. *Running* is from the request until the sibling ran (Podman: its container; CRI: its pod, `tclone kube fork`'s whole call).\n\n",
		cr.Description, cr.Endpoint, r.Config.CRIReps, cr.PodmanMemory, cr.CRIMemory)
	mr := &MethodResult{Warm: cr.Summary}
	p("| path | tclone's capture pause | observer | CRI checkpoint call | sibling pod made and restored | running |\n| :-- | ---: | ---: | ---: | ---: | ---: |\n")
	p("| Podman | %s | %s | | | %s |\n", cell(mr, "podman_pause_ms"), cell(mr, "podman_gap_ms"), cell(mr, "podman_running_ms"))
	p("| CRI | %s | %s | %s | %s | %s |\n\n", cell(mr, "cri_pause_ms"), cell(mr, "cri_gap_ms"), cell(mr, "cri_checkpoint_ms"), cell(mr, "cri_restore_ms"), cell(mr, "cri_running_ms"))
}

// validateCRI checks a run that asked for the CRI forks.
func validateCRI(r *Results) []string {
	if r.Config.CRIMemMiB <= 0 {
		return nil
	}
	cr := r.CRI
	switch {
	case cr == nil:
		return []string{"cri: not run"}
	case len(cr.Samples) != r.Config.CRIReps+1:
		return []string{fmt.Sprintf("cri: %d rounds, want %d", len(cr.Samples), r.Config.CRIReps+1)}
	case cr.PodmanMemory == "" || cr.CRIMemory == "":
		return []string{fmt.Sprintf("cri: the plans' memory modes are not known (Podman %q, CRI %q)", cr.PodmanMemory, cr.CRIMemory)}
	}
	var bad []string
	for _, s := range cr.Samples {
		for _, k := range []string{"podman_pause_ms", "podman_gap_ms", "podman_running_ms", "cri_pause_ms", "cri_gap_ms", "cri_running_ms", "cri_checkpoint_ms", "cri_restore_ms"} {
			if !(s.Metrics[k] > 0) {
				bad = append(bad, fmt.Sprintf("cri round %d: %s is %v", s.Rep, k, s.Metrics[k]))
			}
		}
	}
	return bad
}
