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
// mappings did not change between the read and the dump).
func TestCaptureReadsSmapsAhead(t *testing.T) {
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

	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", "--memory", "copy", containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	// sh and its two sleeps.
	if want := "smaps-ahead: Reading the smaps of 3 tasks ahead"; !strings.Contains(string(log), want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	if strings.Contains(string(log), "smaps were read ahead: read again") {
		t.Errorf("the capture read a frozen task's smaps again:\n%s", log)
	}
}
