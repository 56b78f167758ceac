package fork

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/tclone/tclone/runtime/procfs"
)

// EnvCrashAt names a crash point at which tclone kills itself with SIGKILL.
// It exists for the crash-injection tests, which prove that a fork killed at
// any point leaves the source running and, after recovery, nothing behind.
const EnvCrashAt = "TCLONE_CRASH_AT"

// Crash points, in the order a fork passes them.
const (
	CrashCaptureStarted  = "capture-started"  // journal written, CRIU not started
	CrashSourceSeized    = "source-seized"    // CRIU has seized the source's tree and dumps it
	CrashSnapshotTaken   = "snapshot-taken"   // in post-dump: seized, images and snapshot written
	CrashWithCriu        = "criu-killed"      // in post-dump, CRIU killed first: its network lock and repair mode stay
	CrashDumpDone        = "dump-done"        // CRIU returned, plan not yet complete
	CrashRootfsFilled    = "rootfs-filled"    // sibling root filled, restore not started
	CrashSiblingRestored = "sibling-restored" // sibling running, plan use not yet released
	CrashBeforeReport    = "before-report"    // sibling complete, tclone has not yet exited 0
	CrashEntryEnded      = "entry-ended"      // journal entry ended, watchdog not yet released
)

// CrashSnapshotsHeld is a copy-on-write capture's own crash point: the
// plan's daemon holds the snapshots, the plan is not yet complete. Not in
// CrashPoints, which every fork passes.
const CrashSnapshotsHeld = "snapshots-held"

// CrashPoints lists every crash point, for the tests.
var CrashPoints = []string{
	CrashCaptureStarted, CrashSourceSeized, CrashSnapshotTaken, CrashWithCriu, CrashDumpDone, CrashRootfsFilled, CrashSiblingRestored, CrashBeforeReport, CrashEntryEnded,
}

// EnvPauseAt names a crash point at which tclone says so on stderr and
// waits to be killed from outside: the tests kill it (or its whole cgroup)
// at a known step.
const EnvPauseAt = "TCLONE_PAUSE_AT"

// PausedMessage starts the line a paused tclone writes on stderr.
const PausedMessage = "tclone: paused at "

func crashPoint(name string) {
	if os.Getenv(EnvCrashAt) == name {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not deliverable late, but never continue.
	}
	if os.Getenv(EnvPauseAt) == name {
		fmt.Fprintf(os.Stderr, "%s%s (pid %d)\n", PausedMessage, name, os.Getpid())
		for {
			time.Sleep(time.Hour)
		}
	}
}

// crashWithCriu is CrashWithCriu: the criu process criuPid dies first.
func crashWithCriu(criuPid int) {
	if os.Getenv(EnvCrashAt) == CrashWithCriu {
		syscall.Kill(criuPid, syscall.SIGKILL)
		crashPoint(CrashWithCriu)
	}
}

// crashWhenSeized arms CrashSourceSeized: tclone dies as soon as the criu
// process criuPid traces pid, the source's first task, which CRIU seizes
// after its pre-dump notification returns.
func crashWhenSeized(pid, criuPid int) {
	if os.Getenv(EnvCrashAt) != CrashSourceSeized {
		return
	}
	go func() {
		for {
			if TracerOf(pid) == criuPid {
				crashPoint(CrashSourceSeized)
			}
			time.Sleep(time.Millisecond)
		}
	}()
}

// TracerOf returns the PID of the process tracing pid (0: none); the tests
// use it to see when CRIU holds a tree.
func TracerOf(pid int) int {
	st, err := procfs.ReadStatus(pid)
	if err != nil {
		return 0
	}
	return st.TracerPid
}
