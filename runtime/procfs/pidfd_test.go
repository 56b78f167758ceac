package procfs

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A process that exits within the limit is seen to; one that runs on is
// not, and the wait lasts the limit.
func TestPidfdExited(t *testing.T) {
	wait := func(secs string, limit time.Duration) (bool, time.Duration) {
		cmd := exec.Command("sleep", secs)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatalf("pidfd_open: %v", err)
		}
		defer unix.Close(fd)
		start := time.Now()
		ok, err := PidfdExited(fd, limit)
		if err != nil {
			t.Fatal(err)
		}
		return ok, time.Since(start)
	}
	if ok, _ := wait("0.1", 10*time.Second); !ok {
		t.Fatal("a process that exited within the limit was not seen to")
	}
	if ok, took := wait("60", 300*time.Millisecond); ok || took < 300*time.Millisecond {
		t.Fatalf("a running process: exited %v after %s, want false after the 300ms limit", ok, took)
	}
	if ok, _ := wait("0.1", -1); !ok {
		t.Fatal("without a limit, the exit was not seen")
	}
}
