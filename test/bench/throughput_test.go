package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

// writerTrace makes a writer's buckets: 10 ms each at speed (a share of
// 1024 MiB/s) given by at, with one stop of stall starting at stopAt.
func writerTrace(start int64, total, stopAt, stall time.Duration, at func(time.Duration) float64) []holderreport.WriteBucket {
	var out []holderreport.WriteBucket
	const slot = 10 * time.Millisecond
	for t := time.Duration(0); t < total; t += slot {
		b := holderreport.WriteBucket{StartNs: start + int64(t), EndNs: start + int64(t+slot)}
		if t == stopAt {
			b.EndNs += int64(stall)
			start += int64(stall)
		}
		// 1024 MiB/s is 2621.44 pages per 10 ms.
		b.Pages = int64(math.Round(2621.44 * at(t)))
		out = append(out, b)
	}
	return out
}

// The writer's speed is read against its baseline from the thaw, the end of
// its longest bucket: slow for 500 ms, then back to full speed.
func TestAnalyzeWrites(t *testing.T) {
	const start = int64(1e18)
	forkAt := start + int64(time.Second)
	bks := writerTrace(start, 4*time.Second, time.Second, 200*time.Millisecond, func(t time.Duration) float64 {
		if t > time.Second && t <= 1500*time.Millisecond {
			return 0.3
		}
		return 1
	})
	run, err := analyzeWrites(bks, forkAt, 0, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(run.BaselineMiBs-1024) > 1 || math.Abs(run.StallMs-210) > 0.01 {
		t.Errorf("baseline %v MiB/s, stall %v ms; want 1024, 210", run.BaselineMiBs, run.StallMs)
	}
	if run.RecoveredMs != 500 || math.Abs(run.MeanShare-0.3) > 0.01 || math.Abs(run.LostMs-350) > 5 {
		t.Errorf("recovered at %v ms at %v of full speed (%v ms lost); want 500, 0.3, 350", run.RecoveredMs, run.MeanShare, run.LostMs)
	}
	if len(run.Shares) != 20 || run.Shares[0] > 0.31 || run.Shares[19] < 0.99 {
		t.Errorf("shares %v", run.Shares)
	}

	// A writer that never gets back to full speed, and one with no
	// baseline.
	slow := writerTrace(start, 4*time.Second, time.Second, 200*time.Millisecond, func(t time.Duration) float64 {
		if t > time.Second {
			return 0.5
		}
		return 1
	})
	if run, err := analyzeWrites(slow, forkAt, 0, 2*time.Second); err != nil || run.RecoveredMs != -1 {
		t.Errorf("never recovered: %+v, %v", run, err)
	}
	if _, err := analyzeWrites(bks[95:], forkAt, 0, 2*time.Second); err == nil || !strings.Contains(err.Error(), "baseline") {
		t.Errorf("no baseline: %v", err)
	}
	// Never recovered: what was lost in the window is still counted.
	if run, _ := analyzeWrites(slow, forkAt, 0, 2*time.Second); math.Abs(run.LostMs-1000) > 5 {
		t.Errorf("never recovered: %v ms lost, want 1000", run.LostMs)
	}
}

// A stop after the thaw longer than the pause is not taken for it when the
// pause is known, and a slot the writer spent stopped counts as a slot at
// speed 0, not as the end of the report.
func TestAnalyzeWritesLaterStop(t *testing.T) {
	const start = int64(1e18)
	forkAt := start + int64(time.Second)
	// The pause: 200 ms at 1 s. Then 0.3 of full speed until 1.5 s, a
	// stop of 300 ms at 1.5 s (a busy host), and full speed after.
	var bks []holderreport.WriteBucket
	const slot = 10 * time.Millisecond
	t0 := start
	for t := time.Duration(0); t < 4*time.Second; t += slot {
		b := holderreport.WriteBucket{StartNs: t0, EndNs: t0 + int64(slot), Pages: 2621}
		switch {
		case t == time.Second:
			b.EndNs += int64(200 * time.Millisecond)
		case t == 1500*time.Millisecond:
			b.EndNs += int64(300 * time.Millisecond)
			b.Pages = 786
		case t > time.Second && t < 1500*time.Millisecond:
			b.Pages = 786
		}
		t0 = b.EndNs
		bks = append(bks, b)
	}
	run, err := analyzeWrites(bks, forkAt, 205, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(run.StallMs-210) > 0.01 {
		t.Errorf("stall %v ms, want the pause's 210", run.StallMs)
	}
	// 0.3 for 500 ms, then a 310 ms bucket at 0.03 over slots 5 to 8.
	if run.RecoveredMs != 800 || len(run.Shares) != 20 || run.Shares[5] > 0.1 {
		t.Errorf("recovered at %v ms, shares %v", run.RecoveredMs, run.Shares)
	}
	// The pause not known, the longest stop is taken for it.
	if run, _ := analyzeWrites(bks, forkAt, 0, 2*time.Second); math.Abs(run.StallMs-310) > 0.01 {
		t.Errorf("pause unknown: stall %v ms, want the longest, 310", run.StallMs)
	}
}

// The throughput target reports the twin's recovery with no bound, and
// validation wants every fork the run asked for.
func TestThroughputTarget(t *testing.T) {
	r := &Results{Config: RunConfig{ThroughputMemMiB: 1024, ThroughputReps: 2, ThroughputWindowS: 3}}
	if tg := throughputTarget(r); tg.Status != TargetNotMeasured {
		t.Errorf("not run: %+v", tg)
	}
	if p := strings.Join(validateThroughput(r), "\n"); !strings.Contains(p, "not run") {
		t.Errorf("missing experiment not flagged: %s", p)
	}
	run := func(memory string, rep int, back float64) ThroughputRun {
		return ThroughputRun{Memory: memory, Rep: rep, PauseMs: 200, StallMs: 210, BaselineMiBs: 1000, Shares: []float64{0.3, 1}, RecoveredMs: back, MeanShare: 0.3, LostMs: 70}
	}
	r.Throughput = &ThroughputResult{MemMiB: 1024, WindowS: 3,
		Runs: []ThroughputRun{run("twin", 0, 100), run("twin", 1, 300), run("copy", 0, 0), run("copy", 1, 0)},
		Idle: []IdleTwinRun{{Rep: 0, PauseMs: 120, LifeMs: 900}, {Rep: 1, PauseMs: 130, LifeMs: 1100}}}
	tg := throughputTarget(r)
	if tg.Status != TargetNoBound || tg.Value != 200 || !strings.Contains(tg.Detail, "--memory copy: back to 0.9 after 0.00 ms") || !strings.Contains(tg.Detail, "twins lived 1000 ms") {
		t.Errorf("target %+v", tg)
	}
	if p := validateThroughput(r); len(p) != 0 {
		t.Errorf("good run flagged: %v", p)
	}
	var b strings.Builder
	writeThroughput(r, func(f string, a ...any) { b.WriteString(fmt.Sprintf(f, a...)) })
	if !strings.Contains(b.String(), "## Source speed after the fork") || !strings.Contains(b.String(), "| twin | 1 | 200 | 210 | 1000 | 300 | 0.30 |") {
		t.Errorf("section:\n%s", b.String())
	}

	r.Throughput.Runs[1].RecoveredMs = -1
	r.Throughput.Runs = append(r.Throughput.Runs, run("twin", 2, -1))
	if tg := throughputTarget(r); tg.Value != 3000 || !strings.HasPrefix(tg.Detail, "at least 3000 ms") {
		t.Errorf("unrecovered target %+v", tg)
	}
	r.Throughput.Idle = r.Throughput.Idle[:1]
	p := strings.Join(validateThroughput(r), "\n")
	for _, want := range []string{"3 forks with --memory twin measured, want 2", "1 idle twin forks measured, want 2"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q: %s", want, p)
		}
	}
}
