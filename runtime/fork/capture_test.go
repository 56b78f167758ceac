package fork

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
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
	// CRIU said when the tree ran again: the pause ends there, not at
	// CRIU's return, which comes after what the tree need not wait for.
	h.ResumedAt = t0.Add(97 * time.Millisecond)
	got = pauseTimings(h, t0.Add(160*time.Millisecond))
	if got.SourcePauseMs != 97 || got.ThawMs != 2 {
		t.Fatalf("timings %+v with the tree resumed at 97 ms", got)
	}
	if sum := got.FreezeMs + got.DumpMs + got.SnapshotMs + got.ThawMs; math.Abs(sum-got.SourcePauseMs) > 0.01 {
		t.Fatalf("parts add up to %.2f, pause %.2f", sum, got.SourcePauseMs)
	}
}

// A dump that failed on a traced process names the process and its tracer
// and says what to do; one whose process is gone still says what to do.
func TestUnseizableNamesTheTracer(t *testing.T) {
	cmd := exec.Command("sleep", "100")
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	// ptrace requests come from the thread that started the tracee.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	msg := fmt.Sprintf("Error (compel/src/lib/infect.c:262): Unseizable non-zombie %d found, state t, err -1/10", cmd.Process.Pid)
	got := unseizable(msg)
	want := fmt.Sprintf("process %d (sleep) is traced by process %d (", cmd.Process.Pid, os.Getpid())
	if !strings.Contains(got, want) || !strings.Contains(got, "fork again") {
		t.Errorf("%q, want it to say %q and what to do", got, want)
	}
	if got := unseizable("Error: Unseizable non-zombie 0 found"); !strings.Contains(got, "debugger") {
		t.Errorf("without a process: %q", got)
	}
}
