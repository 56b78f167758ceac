package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ksmDir is the kernel's KSM control directory.
const ksmDir = "/sys/kernel/mm/ksm"

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times (100 on
// every Linux architecture tclone runs on).
const clockTicks = 100

// KSMResult is `podman container fork --memory ksm` of an idle source:
// how the sibling's PSS falls as ksmd merges it with the source, and
// what ksmd's CPU costs meanwhile.
type KSMResult struct {
	Workload string `json:"workload"`
	MemMiB   int    `json:"mem_mib"`
	// Host are ksmd's settings before the run; Restored whether they were
	// back after the fork was removed and `tclone gc` ran.
	Host     map[string]string `json:"host"`
	Restored bool              `json:"restored"`
	// Pause is the fork's source pause, ms.
	PauseMs float64 `json:"pause_ms"`
	// Points are the samples, from the fork's return.
	Points []KSMPoint `json:"points"`
	// ReachedS is when the sibling's PSS first was at most 0.6 of its RSS
	// (-1: never in the window).
	ReachedS float64 `json:"reached_s"`
}

// KSMPoint is one sample of the KSM experiment.
type KSMPoint struct {
	AtS     float64  `json:"at_s"`
	Source  MemUsage `json:"source"`
	Sibling MemUsage `json:"sibling"`
	// KsmdCPU is ksmd's CPU use since the fork returned, as a share of one
	// CPU over that time.
	KsmdCPU float64 `json:"ksmd_cpu"`
	// PagesSharing is /sys/kernel/mm/ksm/pages_sharing.
	PagesSharing int64 `json:"pages_sharing"`
}

// runKSM forks an idle source run with the merge annotation with
// --memory ksm and watches both for the configured window.
func (b *Bench) runKSM(ctx context.Context) *KSMResult {
	w := holderWorkload(1, b.cfg.KSMMemMiB, "holder")
	w.Name = fmt.Sprintf("ksm-%d", b.cfg.KSMMemMiB)
	w.RunArgs = []string{"--annotation", "io.tclone.memory-merge=true"}
	kr := &KSMResult{Workload: fmt.Sprintf("one holder process touching %d MiB of pseudo-random private anonymous memory, run with the annotation io.tclone.memory-merge=true, idle", b.cfg.KSMMemMiB),
		MemMiB: b.cfg.KSMMemMiB, ReachedS: -1}
	var err error
	if kr.Host, err = ksmSettings(); err != nil {
		b.fail(w.Name, MethodTclone+" --memory ksm", -1, err)
		return kr
	}
	prefix := fmt.Sprintf("tcb-%s-ksm", b.runID)
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.removeContainers(prefix + "-src")
		b.fail(w.Name, MethodTclone+" --memory ksm", -1, fmt.Errorf("starting the source: %w", err))
		return kr
	}
	sib := prefix + "-sib"
	err = b.ksmWatch(ctx, kr, src, sib)
	b.removeContainers(sib, src.Name)
	if err != nil {
		b.fail(w.Name, MethodTclone+" --memory ksm", 0, err)
	}
	// gc puts the host's ksmd settings back once no merging fork is
	// young; the run checks it did.
	if _, _, gerr := runCmd(context.Background(), b.tools.Tclone, "gc"); gerr != nil {
		b.fail(w.Name, "tclone gc", -1, gerr)
	}
	now, serr := ksmSettings()
	kr.Restored = serr == nil && fmt.Sprint(now) == fmt.Sprint(kr.Host)
	if !kr.Restored {
		b.fail(w.Name, MethodTclone+" --memory ksm", -1, fmt.Errorf("ksmd's settings after the fork was removed and tclone gc ran: %v (%v), want the host's %v", now, serr, kr.Host))
	}
	return kr
}

func (b *Bench) ksmWatch(ctx context.Context, kr *KSMResult, src *Source, sib string) error {
	b.track(sib)
	st, _, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, memory: "ksm", stats: true})
	if err != nil {
		return err
	}
	kr.PauseMs = st.SourcePauseMs
	start := time.Now()
	cpu0, err := ksmdTicks()
	if err != nil {
		return err
	}
	sibPid, err := b.initPid(ctx, sib)
	if err != nil {
		return err
	}
	for {
		at := time.Since(start)
		srcMem, err := treeMem(src.InitPid)
		if err != nil {
			return fmt.Errorf("reading the source's memory: %w", err)
		}
		sibMem, err := treeMem(sibPid)
		if err != nil {
			return fmt.Errorf("reading the sibling's memory: %w", err)
		}
		cpu, err := ksmdTicks()
		if err != nil {
			return err
		}
		p := KSMPoint{AtS: at.Seconds(), Source: srcMem, Sibling: sibMem, PagesSharing: readInt(filepath.Join(ksmDir, "pages_sharing"))}
		if at > 0 {
			p.KsmdCPU = float64(cpu-cpu0) / clockTicks / at.Seconds()
		}
		kr.Points = append(kr.Points, p)
		if kr.ReachedS < 0 && sibMem.RssKiB > 0 && float64(sibMem.PssKiB) <= 0.6*float64(sibMem.RssKiB) {
			kr.ReachedS = at.Seconds()
		}
		if at >= b.cfg.KSMWindow || ctx.Err() != nil {
			return ctx.Err()
		}
		sleepCtx(ctx, min(b.cfg.KSMWindow/12, b.cfg.KSMWindow-at))
	}
}

func ksmSettings() (map[string]string, error) {
	out := map[string]string{}
	for _, f := range []string{"run", "pages_to_scan", "sleep_millisecs"} {
		b, err := os.ReadFile(filepath.Join(ksmDir, f))
		if err != nil {
			return nil, fmt.Errorf("this host has no KSM: %w", err)
		}
		out[f] = strings.TrimSpace(string(b))
	}
	return out, nil
}

func readInt(path string) int64 {
	b, _ := os.ReadFile(path)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// ksmdTicks is ksmd's CPU time so far, in clock ticks.
func ksmdTicks() (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "ksmd" {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			return 0, err
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			return 0, fmt.Errorf("ksmd's stat is short: %q", s)
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		sy, _ := strconv.ParseInt(f[12], 10, 64)
		return u + sy, nil
	}
	return 0, fmt.Errorf("no ksmd kernel thread: this kernel has no KSM")
}
