package fork

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// EnvCrashAt names a crash point at which tclone kills itself with SIGKILL.
// It exists for the crash-injection tests, which prove that a fork killed at
// any point leaves the source running and, after recovery, nothing behind.
const EnvCrashAt = "TCLONE_CRASH_AT"

// Crash points, in the order a fork passes them.
const (
	CrashCaptureStarted  = "capture-started"  // journal written, nothing frozen yet
	CrashSourceFrozen    = "source-frozen"    // in CRIU's pre-dump: the source is frozen
	CrashSnapshotTaken   = "snapshot-taken"   // in post-dump: frozen, images and snapshot written
	CrashDumpDone        = "dump-done"        // CRIU returned, plan not yet complete
	CrashRootfsFilled    = "rootfs-filled"    // sibling root filled, restore not started
	CrashSiblingRestored = "sibling-restored" // sibling running, plan use not yet released
)

// CrashPoints lists every crash point, for the tests.
var CrashPoints = []string{
	CrashCaptureStarted, CrashSourceFrozen, CrashSnapshotTaken, CrashDumpDone, CrashRootfsFilled, CrashSiblingRestored,
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
