package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tclone/tclone/runtime/branch"
)

// BranchResult is the durable branches experiment: on one source, a fork
// and a branch create in turn (their source pauses side by side), the
// starts of containers from a branch, and the disk that successive branches
// of a workspace that changes a little take.
type BranchResult struct {
	Workload    string `json:"workload"`
	Description string `json:"description"`
	MemMiB      int    `json:"mem_mib"`
	// Samples: fork_pause_ms, branch_pause_ms, branch_capture_ms,
	// durable_ms (from the request), write_ms (after the capture),
	// images_mib and chunks_added_mib.
	Samples []*Sample       `json:"samples"`
	Summary map[string]Stat `json:"summary"`
	Starts  []*BranchStart  `json:"starts"`
	// Successive are DirtyMiB-apart branches of the source.
	DirtyMiB   int           `json:"dirty_mib"`
	Successive []*BranchDisk `json:"successive"`
	// Images are the first two successive branches carried through a
	// registry as checkpoint images.
	Images []*BranchImage `json:"images,omitempty"`
}

// BranchStart is one `podman container branch start --count N`.
type BranchStart struct {
	Count int `json:"count"`
	// TotalMs is the call, from the request until every container ran;
	// PlanMs of it made the plan from the branch (read and checked every
	// chunk); LastRunningMs is when the last container ran.
	TotalMs       float64 `json:"total_ms"`
	PlanMs        float64 `json:"plan_ms"`
	LastRunningMs float64 `json:"last_running_ms"`
}

// BranchDisk is the store after one more branch.
type BranchDisk struct {
	Index          int     `json:"index"`
	ChunksAddedMiB float64 `json:"chunks_added_mib"`
	StoreMiB       float64 `json:"store_mib"`
	// PauseMs is the branch's source pause; CopiedMiB what its capture
	// copied out of its twins, FromBaseMiB what it took from the branch
	// before instead (incremental branches).
	PauseMs     float64 `json:"pause_ms"`
	CopiedMiB   float64 `json:"copied_mib"`
	FromBaseMiB float64 `json:"from_base_mib"`
}

// branchStartCounts are the container counts started from one branch.
var branchStartCounts = []int{1, 4}

// successiveBranches is how many branches the disk experiment takes.
const successiveBranches = 5

func (b *Bench) runBranches(ctx context.Context) *BranchResult {
	w := memWorkload(b.cfg.BranchMemMiB, b.cfg.MemProcs)
	w.Name = "branch-" + w.Name
	dirtyMiB := min(20, max(1, b.cfg.BranchMemMiB/b.cfg.MemProcs/2))
	w.Cmd = append(w.Cmd, "--dirty-kib", strconv.Itoa(dirtyMiB*1024))
	br := &BranchResult{Workload: w.Name, Description: w.Description, MemMiB: w.MemMiB, DirtyMiB: dirtyMiB}
	fail := func(what string, rep int, err error) { b.fail(w.Name, "branch "+what, rep, err) }

	// A store of the run's own, on the disk next to tclone's snapshots.
	store := branch.Store{Dir: fmt.Sprintf("/var/lib/tclone/tcb-branches-%s", b.runID)}
	os.Setenv("TCLONE_BRANCH_DIR", store.Dir)
	defer func() {
		os.Unsetenv("TCLONE_BRANCH_DIR")
		os.RemoveAll(store.Dir)
	}()
	prefix := fmt.Sprintf("tcb-%s-branch", b.runID)
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.removeContainers(prefix + "-src")
		fail("source", -1, err)
		return br
	}
	defer b.removeContainers(src.Name)

	last := ""
	for rep := 0; rep <= b.cfg.BranchReps && ctx.Err() == nil; rep++ {
		s := &Sample{Rep: rep, Cold: rep == 0, Metrics: map[string]float64{}}
		// Alternate which goes first.
		for k := range 2 {
			var err error
			if (rep+k)%2 == 0 {
				err = b.branchForkOnce(ctx, src, fmt.Sprintf("%s-sib%d", prefix, rep), s)
			} else {
				last = fmt.Sprintf("b-%d", rep)
				err = b.branchCreateOnce(ctx, src, last, s)
			}
			if err != nil {
				fail("fork and create", rep, err)
			}
		}
		br.Samples = append(br.Samples, s)
	}
	br.Summary = summarizeWarm(br.Samples)

	for _, n := range branchStartCounts {
		if last == "" || ctx.Err() != nil {
			break
		}
		// --name NAME gives one container NAME, N of them NAME-1..NAME-N.
		name := fmt.Sprintf("%s-start%d", prefix, n)
		made := []string{name}
		if n > 1 {
			made = nil
			for i := 1; i <= n; i++ {
				made = append(made, fmt.Sprintf("%s-%d", name, i))
			}
		}
		for _, m := range made {
			b.track(m)
		}
		out, _, err := runCmd(ctx, b.podmanBranch(), "--url", b.svc.url, "start", "--print-stats", "--count", strconv.Itoa(n), "--name", name, last)
		var st forkStats
		if err == nil {
			err = json.Unmarshal([]byte(out), &st)
		}
		b.removeContainers(made...)
		if err != nil || len(st.Siblings) != n {
			fail(fmt.Sprintf("start --count %d", n), -1, fmt.Errorf("%v: %d containers: %s", err, len(st.Siblings), tail(out, 300)))
			continue
		}
		bs := &BranchStart{Count: n, TotalMs: st.TotalMs, PlanMs: st.CheckpointMs}
		for _, sib := range st.Siblings {
			bs.LastRunningMs = math.Max(bs.LastRunningMs, sib.RunningMs)
		}
		br.Starts = append(br.Starts, bs)
	}

	// The disk: branches a little apart, in a store of their own.
	if _, _, err := runCmd(ctx, b.podmanBranch(), "prune", "--keep-last", "0", "--yes"); err != nil {
		fail("prune", -1, err)
		return br
	}
	for i := range successiveBranches {
		if ctx.Err() != nil {
			break
		}
		if i > 0 {
			if _, err := src.Holder.dirty(ctx); err != nil {
				fail("dirtying the source's memory", i, err)
				break
			}
		}
		s := &Sample{Metrics: map[string]float64{}}
		if err := b.branchCreateOnce(ctx, src, fmt.Sprintf("s-%d", i), s); err != nil {
			fail("successive create", i, err)
			break
		}
		br.Successive = append(br.Successive, &BranchDisk{Index: i + 1, ChunksAddedMiB: s.Metrics["chunks_added_mib"], StoreMiB: float64(diskBytes(store.Dir)) / (1 << 20),
			PauseMs: s.Metrics["branch_pause_ms"], CopiedMiB: s.Metrics["copied_mib"], FromBaseMiB: s.Metrics["from_base_mib"]})
	}
	if len(br.Successive) >= 2 {
		br.Images = b.runBranchImages(ctx, w.Name, []string{"s-0", "s-1"})
	}
	return br
}

func (b *Bench) podmanBranch() string {
	return filepath.Join(filepath.Dir(b.tools.PodmanFork), "podman-branch")
}

// branchForkOnce forks src once, records its pause in s, and removes the
// sibling.
func (b *Bench) branchForkOnce(ctx context.Context, src *Source, sib string, s *Sample) error {
	b.track(sib)
	defer b.removeContainers(sib)
	st, _, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, stats: true})
	if err != nil {
		return err
	}
	s.Metrics["fork_pause_ms"] = st.SourcePauseMs
	return nil
}

// branchCreateOnce creates branch name of src and records its timings in s.
func (b *Bench) branchCreateOnce(ctx context.Context, src *Source, name string, s *Sample) error {
	out, _, err := runCmd(ctx, b.podmanBranch(), "--url", b.svc.url, "create", "--print-stats", src.Name, name)
	if err != nil {
		return err
	}
	var st struct {
		Branch        *branch.Branch `json:"branch"`
		CheckpointMs  float64        `json:"checkpoint_ms"`
		SourcePauseMs float64        `json:"source_pause_ms"`
		WriteMs       float64        `json:"write_ms"`
		DurableMs     float64        `json:"durable_ms"`
		CopiedBytes   int64          `json:"copied_bytes"`
		FromBaseBytes int64          `json:"from_base_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Branch == nil {
		return fmt.Errorf("decoding podman-branch's output: %v: %s", err, tail(out, 300))
	}
	s.Metrics["branch_pause_ms"] = st.SourcePauseMs
	s.Metrics["branch_capture_ms"] = st.CheckpointMs
	s.Metrics["write_ms"] = st.WriteMs
	s.Metrics["durable_ms"] = st.DurableMs
	s.Metrics["images_mib"] = float64(st.Branch.Size.Files) / (1 << 20)
	s.Metrics["chunks_added_mib"] = float64(st.Branch.Size.ChunksAdded) / (1 << 20)
	s.Metrics["copied_mib"] = float64(st.CopiedBytes) / (1 << 20)
	s.Metrics["from_base_mib"] = float64(st.FromBaseBytes) / (1 << 20)
	return nil
}

// diskBytes is the disk space of the files under dir (allocated blocks).
func diskBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(interface{ Blocks() int64 }); ok {
				n += st.Blocks() * 512
			} else {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// writeBranches writes the branches section through p.
func writeBranches(r *Results, p func(string, ...any)) {
	br := r.Branches
	if br == nil {
		return
	}
	p("## Branches\n\nSource: %s. Per round, `podman container fork --print-stats` and `podman container branch create --print-stats` of the same source, in alternating order; one cold round and %d warm ones. Milliseconds (MiB for sizes), warm median (p95). The branch's pause is its capture's; *durable* is from the request until the branch was synced to disk, the writing (*write*) after the source ran on.\n\n",
		br.Description, r.Config.BranchReps)
	mr := &MethodResult{Warm: br.Summary}
	p("| fork's source pause | branch's source pause | branch capture | write | durable | page and other images | disk added by the first |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	p("| %s | %s | %s | %s | %s | %s | %s |\n\n", cell(mr, "fork_pause_ms"), cell(mr, "branch_pause_ms"), cell(mr, "branch_capture_ms"), cell(mr, "write_ms"), cell(mr, "durable_ms"),
		fmtNum(mr.warmMedian("images_mib")), fmtNum(firstSampleMetric(br.Samples, "chunks_added_mib")))
	if len(br.Starts) > 0 {
		p("Containers started from the last branch (`podman container branch start --count N --print-stats`), one call each:\n\n| N | plan from the branch | last container running | call |\n| ---: | ---: | ---: | ---: |\n")
		for _, s := range br.Starts {
			p("| %d | %s | %s | %s |\n", s.Count, fmtMs(s.PlanMs), fmtMs(s.LastRunningMs), fmtMs(s.TotalMs))
		}
		p("\n")
	}
	if len(br.Successive) > 0 {
		p("%d successive branches in an empty store, the source writing %d MiB of its memory anew between two (the same pages, new contents). *Copied* is what the capture copied out of its twins after the source ran on, *from the last* what it took from the branch before instead (incremental branches; the first has none before it):\n\n| branch | source pause (ms) | copied (MiB) | from the last (MiB) | chunks added (MiB) | store on disk (MiB) |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n", len(br.Successive), br.DirtyMiB)
		for _, d := range br.Successive {
			p("| %d | %s | %s | %s | %s | %s |\n", d.Index, fmtMs(d.PauseMs), fmtNum(d.CopiedMiB), fmtNum(d.FromBaseMiB), fmtNum(d.ChunksAddedMiB), fmtNum(d.StoreMiB))
		}
		p("\n")
	}
	writeBranchImages(br, p)
}

func firstSampleMetric(samples []*Sample, metric string) float64 {
	for _, s := range samples {
		if v, ok := s.Metrics[metric]; ok {
			return v
		}
	}
	return math.NaN()
}

// branchTargetKeys are the branch targets.
var branchTargetKeys = []string{"branch_pause_over_fork_pause", "branch_five_disk_over_one", "image_two_pushed_over_one",
	"branch_second_pause_over_first", "branch_second_copied_over_first"}

func branchTargets(r *Results) []Target {
	br := r.Branches
	if br == nil {
		return nil
	}
	exact := br.MemMiB == 1024 && !r.Quick
	pause := Target{Key: branchTargetKeys[0], Bound: 1.25, BoundText: "≤ 1.25 (within noise)",
		Title: fmt.Sprintf("branch create's source pause / a fork's, %s source", sizeText(br.MemMiB)), Value: math.NaN()}
	mr := &MethodResult{Warm: br.Summary}
	if f, c := mr.warmMedian("fork_pause_ms"), mr.warmMedian("branch_pause_ms"); f > 0 && c > 0 {
		pause.Value = c / f
		pause.Detail = fmt.Sprintf("%s ms / %s ms, warm medians of %d rounds", fmtMs(c), fmtMs(f), r.Config.BranchReps)
	}
	judge(&pause, exact)
	disk := Target{Key: branchTargetKeys[1], Bound: 1.3, BoundText: "≤ 1.3",
		Title: fmt.Sprintf("disk of %d successive branches / one, %s source changing ≤ 20 MiB between them", successiveBranches, sizeText(br.MemMiB)), Value: math.NaN()}
	if n := len(br.Successive); n == successiveBranches && br.Successive[0].StoreMiB > 0 {
		disk.Value = br.Successive[n-1].StoreMiB / br.Successive[0].StoreMiB
		disk.Detail = fmt.Sprintf("%s MiB after %d branches, %s MiB after one; %d MiB rewritten between two", fmtNum(br.Successive[n-1].StoreMiB), n, fmtNum(br.Successive[0].StoreMiB), br.DirtyMiB)
	}
	judge(&disk, exact && br.DirtyMiB <= 20)
	second, copied := incrementalTargets(br, exact)
	return []Target{pause, disk, imageTarget(r, exact), second, copied}
}

// incrementalTargets are issue 30's bounds on a second branch of a source
// that rewrote DirtyMiB since the first: its pause, and what it copies out
// of its twins, against the first's (the first two successive branches;
// the first has no branch before it, the store being emptied first).
func incrementalTargets(br *BranchResult, exact bool) (Target, Target) {
	pause := Target{Key: branchTargetKeys[3], Bound: 1.25, BoundText: "≤ 1.25",
		Title: fmt.Sprintf("second branch's source pause / the first's, %s source that rewrote %d MiB between them", sizeText(br.MemMiB), br.DirtyMiB), Value: math.NaN()}
	copied := Target{Key: branchTargetKeys[4], Bound: 0.05, BoundText: "≤ 0.05 (where tclone tracks writes: Linux 6.13)",
		Title: fmt.Sprintf("memory the second branch copies / the first, %s source that rewrote %d MiB between them", sizeText(br.MemMiB), br.DirtyMiB), Value: math.NaN()}
	if len(br.Successive) >= 2 {
		first, second := br.Successive[0], br.Successive[1]
		var pauses []string
		for _, d := range br.Successive {
			pauses = append(pauses, fmtMs(d.PauseMs))
		}
		if first.PauseMs > 0 {
			pause.Value = second.PauseMs / first.PauseMs
			pause.Detail = fmt.Sprintf("%s ms / %s ms, one branch each (the %d successive branches' pauses: %s ms)", fmtMs(second.PauseMs), fmtMs(first.PauseMs), len(br.Successive), strings.Join(pauses, ", "))
		}
		if first.CopiedMiB > 0 {
			copied.Value = second.CopiedMiB / first.CopiedMiB
			copied.Detail = fmt.Sprintf("%s MiB copied out of the twins / %s MiB; the second took %s MiB from the first instead", fmtNum(second.CopiedMiB), fmtNum(first.CopiedMiB), fmtNum(second.FromBaseMiB))
		}
	}
	judge(&pause, exact && br.DirtyMiB <= 20)
	judge(&copied, exact && br.DirtyMiB <= 20)
	return pause, copied
}

// validateBranches checks a run that asked for the branches experiment.
func validateBranches(r *Results) []string {
	if r.Config.BranchMemMiB <= 0 {
		return nil
	}
	br := r.Branches
	switch {
	case br == nil:
		return []string{"branches: not run"}
	case len(br.Samples) != r.Config.BranchReps+1:
		return []string{fmt.Sprintf("branches: %d rounds, want %d", len(br.Samples), r.Config.BranchReps+1)}
	case len(br.Starts) != len(branchStartCounts):
		return []string{fmt.Sprintf("branches: %d starts measured, want %d", len(br.Starts), len(branchStartCounts))}
	case len(br.Successive) != successiveBranches:
		return []string{fmt.Sprintf("branches: %d successive branches, want %d", len(br.Successive), successiveBranches)}
	case len(br.Images) != 2:
		return []string{fmt.Sprintf("branches: %d checkpoint images carried through the registry, want 2", len(br.Images))}
	}
	var bad []string
	for _, im := range br.Images {
		if im.LayerMiB <= 0 || im.PushedMiB <= 0 || im.ExportMs <= 0 || im.PushMs <= 0 || im.PullMs <= 0 || im.ImportMs <= 0 {
			bad = append(bad, fmt.Sprintf("branches: checkpoint image of %s: %+v", im.Branch, *im))
		}
	}
	for _, s := range br.Samples {
		for _, k := range []string{"fork_pause_ms", "branch_pause_ms", "durable_ms", "images_mib"} {
			if s.Metrics[k] <= 0 {
				bad = append(bad, fmt.Sprintf("branches round %d: %s is %v", s.Rep, k, s.Metrics[k]))
			}
		}
	}
	return bad
}
