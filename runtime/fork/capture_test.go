package fork

import (
	"math"
	"testing"
	"time"

	"github.com/tclone/tclone/criuhooks"
)

// The parts of the source's pause add up to it, and seizing, as CRIU
// measured it, is not counted twice.
func TestPauseTimingsAddUp(t *testing.T) {
	t0 := time.Now()
	h := &captureNotify{
		CaptureHooks: criuhooks.CaptureHooks{PostDumpAt: t0.Add(80 * time.Millisecond), PostDumpDone: t0.Add(95 * time.Millisecond)},
		seizeStart:   t0,
		seizeMs:      3,
		criuHeldMs:   90,
	}
	got := pauseTimings(h, t0.Add(100*time.Millisecond))
	if got.SourcePauseMs != 100 || got.FreezeMs != 3 || got.DumpMs != 77 || got.SnapshotMs != 15 || got.ThawMs != 5 || got.CriuFrozenMs != 90 {
		t.Fatalf("timings %+v", got)
	}
	if sum := got.FreezeMs + got.DumpMs + got.SnapshotMs + got.ThawMs; math.Abs(sum-got.SourcePauseMs) > 0.01 {
		t.Fatalf("parts add up to %.2f, pause %.2f", sum, got.SourcePauseMs)
	}
}
