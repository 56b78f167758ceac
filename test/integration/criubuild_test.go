package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tclone's build of CRIU reads its tasks' smaps ahead of their dumps
// (--smaps-read-ahead): the capture's log says so for every process of
// the tree, and no read-ahead was thrown away (the frozen tree's
// mappings did not change between the read and the dump). Its twin
// plugin makes the twins of the whole tree side by side, in one batch.
func TestCaptureReadsAheadAndTwinsSideBySide(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "smaps")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", "sleep 100000 & sleep 100000 & touch /ready; wait")
	eventually(t, 30*time.Second, "the source's processes started", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})

	log := planDumpLog(t, src, "copy")
	// sh and its two sleeps.
	if want := "smaps-ahead: Reading the smaps of 3 tasks ahead"; !strings.Contains(string(log), want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	if strings.Contains(string(log), "smaps were read ahead: read again") {
		t.Errorf("the capture read a frozen task's smaps again:\n%s", log)
	}

	log = planDumpLog(t, src, "twin")
	if want := "tclone twin: 3 twins of 3 processes side by side"; !strings.Contains(string(log), want) {
		t.Errorf("the twin capture's CRIU log does not say %q:\n%s", want, log)
	}
}

// planDumpLog makes a plan of src with --memory memory and returns its
// CRIU dump log, at debug level (a capture's CRIU logs only warnings and
// errors otherwise); the plan goes at the test's end.
func planDumpLog(t *testing.T, src, memory string) []byte {
	t.Helper()
	r := run(t, time.Minute, tcloneBin(), "--log-level", "debug", "fork", "--plan-only", "--memory", memory, containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only --memory %s: %s", memory, r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	return log
}
