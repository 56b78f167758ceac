package main

import (
	"context"
	"fmt"
)

// FilesOnlyResult is `podman container fork --files-only` of sources of
// different memory: its cost does not depend on memory.
type FilesOnlyResult struct {
	Sources []*FilesOnlySource `json:"sources"`
}

// FilesOnlySource is the files-only fork of one workload's source.
type FilesOnlySource struct {
	Workload    string          `json:"workload"`
	Description string          `json:"description"`
	Samples     []*Sample       `json:"samples"`
	Summary     map[string]Stat `json:"summary"`
}

// runFilesOnly forks the files of a memory-less and a 1 GiB source.
func (b *Bench) runFilesOnly(ctx context.Context) *FilesOnlyResult {
	fr := &FilesOnlyResult{}
	for i, w := range []Workload{memWorkload(0, b.cfg.MemProcs), memWorkload(b.cfg.FilesOnlyMemMiB, b.cfg.MemProcs)} {
		if ctx.Err() != nil {
			break
		}
		w.Name = "files-only-" + w.Name
		fs := &FilesOnlySource{Workload: w.Name, Description: w.Description}
		fr.Sources = append(fr.Sources, fs)
		prefix := fmt.Sprintf("tcb-%s-files%d", b.runID, i)
		src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
		if err != nil {
			b.removeContainers(prefix + "-src")
			b.fail(w.Name, MethodTclone, -1, fmt.Errorf("starting the source: %w", err))
			continue
		}
		for rep := 0; rep <= b.cfg.WarmReps && ctx.Err() == nil; rep++ {
			sib := fmt.Sprintf("%s-sib%d", prefix, rep)
			b.track(sib)
			st, wall, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, filesOnly: true, stats: true})
			if err == nil {
				// The sibling runs: a command answers in it.
				_, _, err = b.tools.podman(ctx, "exec", sib, "true")
			}
			b.removeContainers(sib)
			if err != nil {
				b.fail(w.Name, MethodTclone+" --files-only", rep, err)
				continue
			}
			s := &Sample{Rep: rep, Cold: rep == 0, Sibling: sib, Metrics: map[string]float64{
				"pause_ms":       st.SourcePauseMs,
				"to_running_ms":  ms(wall) - st.TotalMs + st.Siblings[0].RunningMs,
				"checkpoint_ms":  st.CheckpointMs,
				"restore_ms":     st.Siblings[0].RestoreMs,
				"fs_snapshot_ms": st.Capture.Timings.SnapshotMs,
			}}
			fs.Samples = append(fs.Samples, s)
		}
		fs.Summary = summarizeWarm(fs.Samples)
		b.removeContainers(src.Name)
	}
	return fr
}
