package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

// forkSibling is one sibling as `podman container fork` reports it, in
// --print-stats and in --format json (shim/podmanfork.Result).
type forkSibling struct {
	ID               string  `json:"id"`
	Name             string  `json:"name"`
	RestoreMs        float64 `json:"restore_ms"`
	ReadyMs          float64 `json:"ready_ms"`
	RunningMs        float64 `json:"running_ms"`
	FirstCommandMs   float64 `json:"first_command_ms"`
	MemoryCompleteMs float64 `json:"memory_complete_ms"`
}

// forkStats mirrors the JSON `podman container fork --print-stats` prints
// (shim/podmanfork.Stats), without linking the Podman bindings.
type forkStats struct {
	Source        string        `json:"source"`
	CheckpointMs  float64       `json:"checkpoint_ms"`
	SourcePauseMs float64       `json:"source_pause_ms"`
	Capture       plan.Plan     `json:"capture"`
	TotalMs       float64       `json:"total_ms"`
	Siblings      []forkSibling `json:"siblings"`
}

// forkRequest is one `podman container fork` of a source.
type forkRequest struct {
	name   string
	count  int
	memory string // --memory: copy, lazy, twin or ksm (empty: none, for --files-only)
	// ready is --ready (empty: podman-fork's default, running).
	ready string
	// parallel is --parallel (0: podman-fork's default).
	parallel int
	// volumeMode is --volume-mode (empty: the default, copy).
	volumeMode string
	// filesOnly is --files-only.
	filesOnly bool
	// stats asks for --print-stats, which also waits until every
	// sibling's memory is complete; without it the call prints the
	// siblings (--format json) and returns once they are ready.
	stats bool
}

// runPodmanFork runs `podman container fork` of src through the run's
// Podman service, and returns its statistics (without req.stats only the
// siblings) and wall time. A failure carries podman-fork's stderr.
func (b *Bench) runPodmanFork(ctx context.Context, src *Source, req forkRequest) (*forkStats, time.Duration, error) {
	args := []string{"--url", b.svc.url, "--count", strconv.Itoa(req.count), "--name", req.name}
	if req.memory != "" {
		args = append(args, "--memory", req.memory)
	}
	if req.ready != "" {
		args = append(args, "--ready", req.ready)
	}
	if req.parallel > 0 {
		args = append(args, "--parallel", strconv.Itoa(req.parallel))
	}
	if req.volumeMode != "" {
		args = append(args, "--volume-mode", req.volumeMode)
	}
	if req.filesOnly {
		args = append(args, "--files-only")
	}
	if req.stats {
		args = append(args, "--print-stats")
	} else {
		args = append(args, "--format", "json")
	}
	out, wall, err := runCmd(ctx, b.tools.PodmanFork, append(args, src.Name)...)
	if err != nil {
		return nil, 0, err
	}
	var st forkStats
	if req.stats {
		err = json.Unmarshal([]byte(out), &st)
	} else {
		err = json.Unmarshal([]byte(out), &st.Siblings)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("decoding podman-fork's output: %w: %s", err, tail(out, 300))
	}
	if len(st.Siblings) != req.count {
		return nil, 0, fmt.Errorf("podman-fork reported %d siblings, want %d", len(st.Siblings), req.count)
	}
	return &st, wall, nil
}

// firstCommand runs the first command (`podman exec container true`) in
// container, a copy of src described by what, then reads the largest gap
// src's observer saw since it was last poked.
func (b *Bench) firstCommand(ctx context.Context, src *Source, container, what string) (time.Duration, holderreport.Report, error) {
	_, execD, err := b.tools.podman(ctx, "exec", container, "true")
	if err != nil {
		return 0, holderreport.Report{}, fmt.Errorf("first command in %s: %w", what, err)
	}
	gap, err := src.Holder.poke(ctx)
	return execD, gap, err
}

// podmanCheckpointStats is `podman container checkpoint --print-stats`.
type podmanCheckpointStats struct {
	Duration   int64 `json:"podman_checkpoint_duration"` // µs
	Containers []struct {
		RuntimeDuration int64 `json:"runtime_checkpoint_duration"`
		Criu            struct {
			FreezingTime int64 `json:"freezing_time"`
			FrozenTime   int64 `json:"frozen_time"`
			MemdumpTime  int64 `json:"memdump_time"`
			MemwriteTime int64 `json:"memwrite_time"`
			PagesScanned int64 `json:"pages_scanned"`
			PagesWritten int64 `json:"pages_written"`
		} `json:"criu_statistics"`
	} `json:"container_statistics"`
}

// podmanRestoreStats is `podman container restore --print-stats`.
type podmanRestoreStats struct {
	Duration   int64 `json:"podman_restore_duration"`
	Containers []struct {
		RuntimeDuration int64 `json:"runtime_restore_duration"`
		Criu            struct {
			ForkingTime   int64 `json:"forking_time"`
			RestoreTime   int64 `json:"restore_time"`
			PagesRestored int64 `json:"pages_restored"`
		} `json:"criu_statistics"`
	} `json:"container_statistics"`
}

func usMs(us int64) float64 { return float64(us) / 1000 }

func addMem(m map[string]float64, prefix string, u MemUsage) {
	m[prefix+"_procs"] = float64(u.Procs)
	m[prefix+"_rss_kib"] = float64(u.RssKiB)
	m[prefix+"_pss_kib"] = float64(u.PssKiB)
	m[prefix+"_pss_anon_kib"] = float64(u.PssAnonKiB)
	m[prefix+"_anon_kib"] = float64(u.AnonKiB)
}

// forkFunc makes one copy of the source. It returns the sample and the
// copy's handle (a container name, or a host PID as a string), set even on
// failure when something must be cleaned up.
type forkFunc func(ctx context.Context, rep int) (*Sample, string, error)

// measureReps runs 1 cold + warm forks, keeps the cold fork's copy for the
// later memory reading, and removes every other copy as soon as it is
// measured.
func (b *Bench) measureReps(ctx context.Context, w Workload, mr *MethodResult, warm int,
	fork forkFunc, remove func(string), laterMem func(copy string) (src, sib MemUsage, err error)) {
	var kept string
	var keptAt time.Time
	for rep := 0; rep <= warm && ctx.Err() == nil; rep++ {
		b.logf("  %s %s rep %d/%d", w.Name, mr.Method, rep, warm)
		s, copy, err := fork(ctx, rep)
		if err != nil {
			b.fail(w.Name, mr.Method, rep, err)
			if copy != "" {
				remove(copy)
			}
			continue
		}
		s.Rep, s.Cold = rep, rep == 0
		mr.Samples = append(mr.Samples, s)
		if rep == 0 {
			kept, keptAt = copy, time.Now()
		} else {
			remove(copy)
		}
	}
	if kept == "" {
		return
	}
	if wait := time.Until(keptAt.Add(b.cfg.LaterDelay)); wait > 0 {
		b.logf("  %s %s: waiting %.0fs for the later memory reading", w.Name, mr.Method, wait.Seconds())
		sleepCtx(ctx, wait)
	}
	src, sib, err := laterMem(kept)
	if err != nil {
		b.fail(w.Name, mr.Method, 0, fmt.Errorf("memory %v after the fork: %w", b.cfg.LaterDelay, err))
	} else {
		mr.Later = &LaterMem{AfterS: time.Since(keptAt).Seconds(), Source: src, Sibling: sib}
	}
	remove(kept)
}

func (b *Bench) warmReps(w Workload) int {
	if w.MemMiB >= b.cfg.LargeFromMiB && w.Kind == "mem" {
		return b.cfg.LargeWarmReps
	}
	return b.cfg.WarmReps
}

// memoryOf is the --memory of a tclone method.
func memoryOf(method string) string {
	switch method {
	case MethodTcloneLazy:
		return "lazy"
	case MethodTcloneTwin:
		return "twin"
	}
	return "copy"
}

// runContainerMethod measures tclone (copy, lazy or twin) or stock Podman on a
// fresh source container of w.
func (b *Bench) runContainerMethod(ctx context.Context, w Workload, wr *WorkloadResult, method string) {
	mr := &MethodResult{Method: method}
	wr.Methods[method] = mr
	rt, tag := "tclone", "tc"
	switch method {
	case MethodPodman:
		rt, tag = stockRuntime, "pd"
	case MethodTcloneLazy:
		tag = "tl"
	case MethodTcloneTwin:
		tag = "tw"
	}
	prefix := fmt.Sprintf("tcb-%s-%s-%s", b.runID, w.Name, tag)
	src, err := b.startSource(ctx, w, prefix+"-src", rt)
	if err != nil {
		b.fail(w.Name, method, -1, fmt.Errorf("starting the source: %w", err))
		b.removeContainers(prefix + "-src")
		return
	}
	defer b.removeContainers(src.Name)
	if mr.IdleGapMs, err = idleGap(ctx, src.Holder); err != nil {
		b.fail(w.Name, method, -1, fmt.Errorf("idle observer gap: %w", err))
	}
	var fork forkFunc
	switch method {
	case MethodTclone, MethodTcloneLazy, MethodTcloneTwin:
		memory := memoryOf(method)
		fork = func(ctx context.Context, rep int) (*Sample, string, error) {
			return b.tcloneFork(ctx, src, fmt.Sprintf("%s%d", prefix, rep), memory)
		}
	case MethodPodman:
		staticDir, _, err := b.tools.podman(ctx, "inspect", "--format", "{{.StaticDir}}", src.Name)
		if err != nil {
			b.fail(w.Name, method, -1, err)
			return
		}
		fork = func(ctx context.Context, rep int) (*Sample, string, error) {
			return b.podmanFork(ctx, w, src, strings.TrimSpace(staticDir), fmt.Sprintf("%s%d", prefix, rep), rep)
		}
	}
	b.measureReps(ctx, w, mr, b.warmReps(w), fork,
		func(name string) { b.removeContainers(name) },
		func(sib string) (MemUsage, MemUsage, error) {
			s, err := treeMem(src.InitPid)
			if err != nil {
				return s, MemUsage{}, err
			}
			c, err := b.containerMem(ctx, sib)
			return s, c, err
		})
}

// tcloneFork is one `podman container fork --memory memory --ready exec
// --print-stats` of src. Its times come from podman-fork's own figures,
// each from the start of its fork request, plus the client's share of its
// wall time (start-up, connecting, printing: the wall time less its
// total_ms), so that they run from starting the command like stock
// Podman's: running, the first command (`true`, which podman-fork runs in
// the sibling through the API as soon as it runs), and memory complete
// (which --print-stats waits for). Then the harness runs `podman exec
// SIBLING true` itself (cli_exec_ms) and reads the observer.
func (b *Bench) tcloneFork(ctx context.Context, src *Source, sib, memory string) (*Sample, string, error) {
	if _, err := src.Holder.poke(ctx); err != nil {
		return nil, "", err
	}
	b.track(sib)
	st, wall, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, memory: memory, ready: "exec", stats: true})
	if err != nil {
		return nil, sib, err
	}
	s0 := st.Siblings[0]
	if s0.FirstCommandMs <= 0 || s0.MemoryCompleteMs <= 0 {
		return nil, sib, fmt.Errorf("podman-fork --print-stats --ready exec reported no first_command_ms (%v) or memory_complete_ms (%v)", s0.FirstCommandMs, s0.MemoryCompleteMs)
	}
	execD, gap, err := b.firstCommand(ctx, src, sib, "the sibling")
	if err != nil {
		return nil, sib, err
	}
	client := ms(wall) - st.TotalMs
	m := map[string]float64{
		"pause_ms":            st.SourcePauseMs,
		"observer_gap_ms":     gap.MaxGapMs,
		"client_ms":           client,
		"fork_wall_ms":        ms(wall),
		"to_running_ms":       client + s0.RunningMs,
		"first_command_ms":    client + s0.FirstCommandMs,
		"memory_complete_ms":  client + s0.MemoryCompleteMs,
		"exec_ms":             s0.FirstCommandMs - s0.RunningMs,
		"cli_exec_ms":         ms(execD),
		"checkpoint_ms":       st.CheckpointMs,
		"restore_ms":          s0.RestoreMs,
		"ready_ms":            s0.ReadyMs,
		"internal_total_ms":   st.TotalMs,
		"internal_running_ms": s0.RunningMs,
		"capture_ms":          st.Capture.Timings.TotalMs,
		"freeze_ms":           st.Capture.Timings.FreezeMs,
		"dump_ms":             st.Capture.Timings.DumpMs,
		"fs_snapshot_ms":      st.Capture.Timings.SnapshotMs,
		"thaw_ms":             st.Capture.Timings.ThawMs,
		"criu_frozen_ms":      st.Capture.Timings.CriuFrozenMs,
		"pages_written":       float64(st.Capture.Pages.PagesWritten),
		"tmpfs_bytes":         float64(st.Capture.Pages.BytesWritten),
		"captured_processes":  float64(st.Capture.Tree.Processes),
		"captured_threads":    float64(st.Capture.Tree.Threads),
	}
	if st.Capture.Rootfs != nil {
		m["disk_bytes"] = float64(st.Capture.Rootfs.Stats.Bytes)
	} else {
		m["disk_bytes"] = 0
	}
	if memory == "twin" {
		// What the capture held: validation checks that every process
		// got a twin (a capture that fell back to copying has none).
		m["twins"], m["held_processes"], m["twins_took_ms"] = 0, 0, 0
		if sn := st.Capture.Snapshots; sn != nil {
			m["twins"], m["held_processes"], m["twins_took_ms"] = float64(sn.Twins), float64(sn.Processes), sn.TookMs
		}
	}
	if err := b.readMem(ctx, m, src.InitPid, sib); err != nil {
		return nil, sib, err
	}
	rt, err := b.ociRuntime(ctx, sib)
	if err != nil {
		return nil, sib, err
	}
	return &Sample{Sibling: sib, RestoreRuntime: rt, Metrics: m}, sib, nil
}

// ociRuntime is the runtime Podman records for a container: for a copy, the
// one its restore ran with.
func (b *Bench) ociRuntime(ctx context.Context, name string) (string, error) {
	out, _, err := b.tools.podman(ctx, "inspect", "--format", "{{.OCIRuntime}}", name)
	if err != nil {
		return "", fmt.Errorf("reading the runtime of %s: %w", name, err)
	}
	return strings.TrimSpace(out), nil
}

// readMem records the source's and the sibling container's memory.
func (b *Bench) readMem(ctx context.Context, m map[string]float64, srcPid int, sib string) error {
	s, err := treeMem(srcPid)
	if err != nil {
		return fmt.Errorf("source memory: %w", err)
	}
	c, err := b.containerMem(ctx, sib)
	if err != nil {
		return fmt.Errorf("sibling memory: %w", err)
	}
	addMem(m, "source", s)
	addMem(m, "sibling", c)
	return nil
}

// podmanFork is one stock checkpoint --leave-running --export + restore
// --import --name of src, through the podman CLI, with crun.
func (b *Bench) podmanFork(ctx context.Context, w Workload, src *Source, staticDir, sib string, rep int) (*Sample, string, error) {
	archive := filepath.Join(b.cfg.ArchiveDir, fmt.Sprintf("tcb-%s-%s-%d.tar", b.runID, w.Name, rep))
	defer os.Remove(archive)
	if _, err := src.Holder.poke(ctx); err != nil {
		return nil, "", err
	}
	out, ckD, err := b.tools.podman(ctx, "container", "checkpoint", "--leave-running", "--export", archive,
		"--compress", "none", "--print-stats", src.Name)
	if err != nil {
		return nil, "", err
	}
	var ck podmanCheckpointStats
	if err := json.Unmarshal([]byte(out), &ck); err != nil || len(ck.Containers) != 1 {
		return nil, "", fmt.Errorf("decoding podman checkpoint --print-stats (%v): %s", err, tail(out, 300))
	}
	imagesBytes := dirBytes(filepath.Join(staticDir, "checkpoint"))
	var archiveBytes int64
	if fi, err := os.Stat(archive); err == nil {
		archiveBytes = fi.Size()
	}
	b.track(sib)
	// The CLI would take crun from the archive (cmd/podman/root.go), but
	// the API service would use its default, tclone here: the baseline
	// names its runtime rather than depend on which.
	out, rsD, err := b.tools.podman(ctx, "--runtime", stockRuntime, "container", "restore", "--import", archive, "--name", sib, "--print-stats")
	if err != nil {
		return nil, sib, err
	}
	var rs podmanRestoreStats
	if err := json.Unmarshal([]byte(out), &rs); err != nil || len(rs.Containers) != 1 {
		return nil, sib, fmt.Errorf("decoding podman restore --print-stats (%v): %s", err, tail(out, 300))
	}
	execD, gap, err := b.firstCommand(ctx, src, sib, "the restored container")
	if err != nil {
		return nil, sib, err
	}
	c := ck.Containers[0].Criu
	r := rs.Containers[0]
	m := map[string]float64{
		"pause_ms":              usMs(c.FreezingTime + c.FrozenTime),
		"observer_gap_ms":       gap.MaxGapMs,
		"to_running_ms":         ms(ckD + rsD),
		"exec_ms":               ms(execD),
		"first_command_ms":      ms(ckD + rsD + execD),
		"checkpoint_ms":         ms(ckD),
		"restore_ms":            ms(rsD),
		"runtime_checkpoint_ms": usMs(ck.Containers[0].RuntimeDuration),
		"runtime_restore_ms":    usMs(r.RuntimeDuration),
		"criu_freezing_ms":      usMs(c.FreezingTime),
		"criu_frozen_ms":        usMs(c.FrozenTime),
		"criu_memdump_ms":       usMs(c.MemdumpTime),
		"criu_memwrite_ms":      usMs(c.MemwriteTime),
		"criu_restore_ms":       usMs(r.Criu.RestoreTime),
		"pages_written":         float64(c.PagesWritten),
		// The export archive, which this benchmark puts on tmpfs.
		"tmpfs_bytes": float64(archiveBytes),
		// CRIU's images in the container's directory on disk; the import
		// writes them once more under the new container's directory.
		"disk_bytes": float64(imagesBytes),
	}
	if err := b.readMem(ctx, m, src.InitPid, sib); err != nil {
		return nil, sib, err
	}
	rt, err := b.ociRuntime(ctx, sib)
	if err != nil {
		return nil, sib, err
	}
	if rt != stockRuntime {
		return nil, sib, fmt.Errorf("the stock restore of %s ran with %q, not %s: the baseline would not be stock Podman with crun", sib, rt, stockRuntime)
	}
	return &Sample{Sibling: sib, RestoreRuntime: rt, Metrics: m}, sib, nil
}

// stockRuntime is the runtime of the stock Podman baseline, source and copy.
const stockRuntime = "crun"

// hostTree is a holder tree running on the host in its own PID namespace,
// so that CRIU can restore a copy next to it.
type hostTree struct {
	cmd    *exec.Cmd // unshare
	pid    int       // the holder, init of the namespace
	dir    string
	holder holderRef
}

func (b *Bench) startHostTree(ctx context.Context, w Workload) (*hostTree, error) {
	dir, err := os.MkdirTemp(b.tmp, "host-"+w.Name+"-")
	if err != nil {
		return nil, err
	}
	report := filepath.Join(dir, "report.json")
	args := append([]string{"--pid", "--fork", b.tools.Holder, "serve"}, w.HolderArgs...)
	args = append(args, "--setsid", "--sleep-bin", "/bin/sleep", "--report", report)
	cmd := exec.Command(b.tools.Unshare, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the host tree: %w", err)
	}
	t := &hostTree{cmd: cmd, dir: dir}
	b.trackCmd(cmd)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(report); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.stop(b)
			return nil, errors.New("the host tree did not become ready within 3 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b2, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	if err != nil {
		t.stop(b)
		return nil, err
	}
	f := strings.Fields(string(b2))
	if len(f) != 1 {
		t.stop(b)
		return nil, fmt.Errorf("unshare has children %q, want one", f)
	}
	t.pid, _ = strconv.Atoi(f[0])
	t.holder = holderRef{pid: t.pid, report: report}
	sleepCtx(ctx, w.Settle)
	return t, nil
}

func (t *hostTree) stop(b *Bench) {
	if t.pid > 0 {
		syscall.Kill(t.pid, syscall.SIGKILL)
	}
	t.cmd.Process.Kill()
	t.cmd.Wait()
	b.untrackCmd(t.cmd)
	os.RemoveAll(t.dir)
}

// runCriu measures raw criu dump --leave-running + criu restore of the
// workload's tree run on the host.
func (b *Bench) runCriu(ctx context.Context, w Workload, wr *WorkloadResult) {
	mr := &MethodResult{Method: MethodCriu}
	wr.Methods[MethodCriu] = mr
	if !w.HostTree {
		mr.NotMeasured = "no equivalent host tree: tmux, the shells and the http server need the container's own mount and network namespaces, which is what the Podman baseline measures"
		return
	}
	t, err := b.startHostTree(ctx, w)
	if err != nil {
		b.fail(w.Name, MethodCriu, -1, err)
		return
	}
	defer t.stop(b)
	if mr.IdleGapMs, err = idleGap(ctx, t.holder); err != nil {
		b.fail(w.Name, MethodCriu, -1, fmt.Errorf("idle observer gap: %w", err))
	}
	kill := func(copy string) {
		pid, _ := strconv.Atoi(copy)
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 30*time.Second)
			b.untrackPid(pid)
		}
	}
	b.measureReps(ctx, w, mr, b.warmReps(w),
		func(ctx context.Context, rep int) (*Sample, string, error) { return b.criuFork(ctx, w, t, rep) },
		kill,
		func(copy string) (MemUsage, MemUsage, error) {
			pid, _ := strconv.Atoi(copy)
			s, err := treeMem(t.pid)
			if err != nil {
				return s, MemUsage{}, err
			}
			c, err := treeMem(pid)
			return s, c, err
		})
}

func (b *Bench) criuFork(ctx context.Context, w Workload, t *hostTree, rep int) (*Sample, string, error) {
	img := filepath.Join(b.cfg.CriuDir, fmt.Sprintf("tcb-%s-%s-%d", b.runID, w.Name, rep))
	if err := os.MkdirAll(img, 0o700); err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(img)
	if _, err := t.holder.poke(ctx); err != nil {
		return nil, "", err
	}
	_, dumpD, err := runCmd(ctx, b.tools.Criu, "dump", "-t", strconv.Itoa(t.pid), "-D", img,
		"--leave-running", "-o", "dump.log", "-v1")
	if err != nil {
		return nil, "", fmt.Errorf("%w; dump.log: %s", err, tail(string(must(os.ReadFile(filepath.Join(img, "dump.log")))), 800))
	}
	imgBytes := dirBytes(img)
	if fi, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
		imgBytes -= fi.Size()
	}
	pidfile := filepath.Join(img, "copy.pid")
	_, restD, err := runCmd(ctx, b.tools.Criu, "restore", "-D", img, "-d", "--pidfile", pidfile,
		"-o", "restore.log", "-v1")
	copyPid := 0
	if pb, perr := os.ReadFile(pidfile); perr == nil {
		copyPid, _ = strconv.Atoi(strings.TrimSpace(string(pb)))
	}
	copy := ""
	if copyPid > 0 {
		copy = strconv.Itoa(copyPid)
		b.trackPid(copyPid)
	}
	if err != nil {
		return nil, copy, fmt.Errorf("%w; restore.log: %s", err, tail(string(must(os.ReadFile(filepath.Join(img, "restore.log")))), 800))
	}
	if copyPid <= 0 {
		return nil, "", errors.New("criu restore wrote no pidfile")
	}
	gap, err := t.holder.poke(ctx)
	if err != nil {
		return nil, copy, err
	}
	m := map[string]float64{
		"observer_gap_ms": gap.MaxGapMs,
		"dump_ms":         ms(dumpD),
		"restore_ms":      ms(restD),
		"to_running_ms":   ms(dumpD + restD),
		"tmpfs_bytes":     float64(imgBytes),
		"disk_bytes":      0,
	}
	if d, err := openStats(img, stats.CriuGetDumpStats); err == nil {
		m["pause_ms"] = usMs(int64(d.GetFreezingTime()) + int64(d.GetFrozenTime()))
		m["criu_freezing_ms"] = usMs(int64(d.GetFreezingTime()))
		m["criu_frozen_ms"] = usMs(int64(d.GetFrozenTime()))
		m["criu_memdump_ms"] = usMs(int64(d.GetMemdumpTime()))
		m["criu_memwrite_ms"] = usMs(int64(d.GetMemwriteTime()))
		m["pages_written"] = float64(d.GetPagesWritten())
	} else {
		return nil, copy, fmt.Errorf("reading CRIU's dump statistics: %w", err)
	}
	if r, err := openStats(img, stats.CriuGetRestoreStats); err == nil {
		m["criu_restore_ms"] = usMs(int64(r.GetRestoreTime()))
	}
	s, err := treeMem(t.pid)
	if err != nil {
		return nil, copy, fmt.Errorf("source memory: %w", err)
	}
	c, err := treeMem(copyPid)
	if err != nil {
		return nil, copy, fmt.Errorf("copy memory: %w", err)
	}
	addMem(m, "source", s)
	addMem(m, "sibling", c)
	return &Sample{Sibling: "pid " + copy, RestoreRuntime: "criu", Metrics: m}, copy, nil
}

func openStats[T any](dir string, get func(*os.File) (T, error)) (T, error) {
	f, err := os.Open(dir)
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.Close()
	return get(f)
}

// floorResult is holder forkfloor's output.
type floorResult struct {
	MemMiB   int       `json:"mem_mib"`
	RssKiB   int64     `json:"rss_kib"`
	ForkMs   []float64 `json:"fork_ms"`
	TouchMs  float64   `json:"touch_ms"`
	MedianMs float64   `json:"median_ms"`
	// The rewrites, with rewrite set.
	RewriteAfterForkMs float64 `json:"rewrite_after_fork_ms"`
	RewriteMs          float64 `json:"rewrite_ms"`
}

func (b *Bench) forkFloor(ctx context.Context, memMiB, reps int, rewrite bool) (*floorResult, error) {
	args := []string{"forkfloor", "--mem-mib", strconv.Itoa(memMiB), "--reps", strconv.Itoa(reps)}
	if rewrite {
		args = append(args, "--rewrite")
	}
	out, _, err := runCmd(ctx, b.tools.Holder, args...)
	if err != nil {
		return nil, err
	}
	var r floorResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("decoding forkfloor output: %w", err)
	}
	return &r, nil
}

// runForkRef measures fork() of one process that touched
// --fork-ref-mib MiB, --fork-ref-reps times, and keeps the median: the
// yardstick of the twin capture's pause.
func (b *Bench) runForkRef(ctx context.Context) *ForkRefResult {
	res := &ForkRefResult{MemMiB: b.cfg.ForkRefMiB, ForkMs: []float64{}}
	f, err := b.forkFloor(ctx, b.cfg.ForkRefMiB, b.cfg.ForkRefReps, true)
	if err == nil && len(f.ForkMs) != b.cfg.ForkRefReps {
		err = fmt.Errorf("holder forkfloor timed %d forks, want %d", len(f.ForkMs), b.cfg.ForkRefReps)
	}
	if err != nil {
		res.Error = err.Error()
		b.fail("fork-ref", MethodFork, -1, err)
		return res
	}
	res.RssKiB, res.TouchMs, res.ForkMs, res.MedianMs = f.RssKiB, f.TouchMs, f.ForkMs, f.MedianMs
	res.RewriteAfterForkMs, res.RewriteMs = f.RewriteAfterForkMs, f.RewriteMs
	if m := summarize(f.ForkMs).Median; math.Abs(m-f.MedianMs) > 1e-6 {
		b.fail("fork-ref", MethodFork, -1, fmt.Errorf("holder forkfloor reported a median of %v ms, its samples' is %v ms", f.MedianMs, m))
	}
	return res
}

// runFork measures the fork() floor for w: fork() of one process holding
// as much anonymous memory as the source tree, plus one fork() of a tiny
// process for every other process of the tree.
func (b *Bench) runFork(ctx context.Context, w Workload, wr *WorkloadResult) {
	mr := &MethodResult{Method: MethodFork}
	wr.Methods[MethodFork] = mr
	anonKiB, procs := -1.0, 0.0
	for _, method := range []string{MethodTclone, MethodTcloneLazy, MethodTcloneTwin, MethodPodman} {
		if m := wr.Methods[method]; m != nil {
			for _, s := range m.Samples {
				if s.Cold {
					anonKiB, procs = s.Metrics["source_anon_kib"], s.Metrics["source_procs"]
				}
			}
			if anonKiB < 0 && len(m.Samples) > 0 {
				anonKiB, procs = m.Samples[0].Metrics["source_anon_kib"], m.Samples[0].Metrics["source_procs"]
			}
		}
		if anonKiB >= 0 {
			break
		}
	}
	if anonKiB < 0 {
		mr.NotMeasured = "no source memory reading to size it by (the container methods failed)"
		return
	}
	memMiB := int(math.Ceil(anonKiB / 1024))
	tiny, err := b.forkFloor(ctx, 0, 21, false)
	if err != nil {
		b.fail(w.Name, MethodFork, -1, err)
		return
	}
	tinyMs := summarize(tiny.ForkMs).Median
	big, err := b.forkFloor(ctx, memMiB, b.warmReps(w)+1, false)
	if err != nil {
		b.fail(w.Name, MethodFork, -1, err)
		return
	}
	for i, f := range big.ForkMs {
		mr.Samples = append(mr.Samples, &Sample{Rep: i, Cold: i == 0, Metrics: map[string]float64{
			"fork_ms":       f,
			"fork_tiny_ms":  tinyMs,
			"floor_ms":      f + math.Max(procs-1, 0)*tinyMs,
			"floor_mem_mib": float64(memMiB),
			"floor_rss_kib": float64(big.RssKiB),
			"floor_procs":   procs,
		}})
	}
}
