package integration

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// A files-only fork gives a new container the source's root filesystem and
// a copy of its volume as they were at one instant, and runs the
// container's command from the start on them: none of the source's
// processes or memory comes along. The source runs on, untouched.
func TestPodmanForkFilesOnly(t *testing.T) {
	requireStack(t)
	vol := volume(t, "fovol")
	src := name(t, "fosrc")
	// Each start of the command appends to the volume's log and starts a
	// counter at 1 in the root filesystem.
	script := `echo "start $(hostname)" >> /data/starts; echo built > /tmp/artifact; i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.02; done`
	podman(t, "run", "-d", "--name", src, "-v", vol+":/data", busybox, "sh", "-c", script)
	eventually(t, 10*time.Second, "source counting past 50", func() error {
		if c := podmanTry(t, "exec", src, "cat", "/tmp/c"); c.code != 0 || len(strings.TrimSpace(c.stdout)) < 2 {
			return errorf("counter %q", c.stdout)
		}
		return nil
	})
	before := volumeNames(t)

	for _, bad := range [][]string{{"--memory", "lazy"}, {"--tcp-established"}} {
		if r := forkCLI(t, append([]string{"--files-only"}, append(bad, src)...)...); r.code == 0 {
			t.Errorf("--files-only %v accepted", bad)
		}
	}

	r := forkCLI(t, "--files-only", "--print-stats", src)
	if r.code != 0 {
		t.Fatalf("files-only fork: %s", r.stderr)
	}
	var st struct {
		SourcePauseMs float64 `json:"source_pause_ms"`
		Capture       struct {
			FilesOnly bool `json:"files_only"`
			Tree      struct{ Processes int }
		}
		Siblings []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("--print-stats: %v %q", err, r.stdout)
	}
	if !st.Capture.FilesOnly || st.Capture.Tree.Processes != 0 || st.SourcePauseMs <= 0 {
		t.Errorf("capture of a files-only fork: %s", r.stdout)
	}
	t.Logf("source pause %.1f ms", st.SourcePauseMs)
	sib := st.Siblings[0].Name

	// The command ran from the start, on the source's files: its log has
	// the source's start and its own.
	starts := podman(t, "exec", sib, "cat", "/data/starts")
	if lines := strings.Split(starts, "\n"); len(lines) != 2 || !strings.Contains(lines[0], "start") || !strings.HasSuffix(lines[1], sib) {
		t.Errorf("the sibling's volume log is %q, want the source's start, then the sibling's", starts)
	}
	if got := podman(t, "exec", src, "cat", "/data/starts"); strings.Count(got, "start") != 1 {
		t.Errorf("the source's volume log is %q: the sibling wrote into the source's volume", got)
	}
	if got := podman(t, "exec", sib, "cat", "/tmp/artifact"); got != "built" {
		t.Errorf("the sibling's root filesystem lacks the source's file: %q", got)
	}
	// Its processes are its own: the shell is the container's first.
	if pid := podman(t, "exec", sib, "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(pid, "/data/starts") {
		t.Errorf("the sibling's init runs %q, want the container's command", pid)
	}
	if err := counterAdvances(t, src); err != nil {
		t.Errorf("the source after a files-only fork: %v", err)
	}
	if !slices.Contains(volumeNames(t), vol+"-"+sib) {
		t.Errorf("no copy of %s for the sibling: %v", vol, volumeNames(t))
	}
	podman(t, "rm", "-f", "-v", "-t", "0", sib)
	if after := volumeNames(t); !slices.Equal(after, before) {
		t.Errorf("volumes after removing the sibling: %v, want %v", after, before)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// A source removed while a files-only fork of it is under way ends the
// fork with an error, and nothing of it stays: no sibling, no volume copy,
// no plan or snapshot.
func TestPodmanForkFilesOnlySourceRemoved(t *testing.T) {
	requireStack(t)
	vol := volume(t, "forvol")
	src := name(t, "forsrc")
	podman(t, "run", "-d", "--name", src, "-v", vol+":/data", busybox, "sh", "-c", "echo x > /data/f; exec sleep 100000")
	eventually(t, 10*time.Second, "source ready", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/data/f"); r.code != 0 {
			return errorf("%s", r.stderr)
		}
		return nil
	})
	before := volumeNames(t)
	id := containerID(t, src)
	done := make(chan result, 1)
	go func() { done <- forkCLI(t, "--files-only", "--count", "2", "--hook", "sleep 3", src) }()
	eventually(t, 60*time.Second, "first sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	podman(t, "rm", "-f", "-t", "0", src)
	r := <-done
	if r.code == 0 {
		t.Fatal("a files-only fork succeeded though its source was removed midway")
	}
	if left := podman(t, "ps", "-a", "--filter", "label=io.tclone.forked-from="+id, "--format", "{{.Names}}"); left != "" {
		t.Fatalf("siblings left: %s", left)
	}
	if after := volumeNames(t); !slices.Equal(after, before) {
		t.Errorf("volumes after the failed fork: %v, want %v", after, before)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// `tclone fork --files-only` of a bundle: the sibling gets the source's
// files at the fork instant and runs its own command from the start; the
// source keeps running, and its processes were never seen by CRIU.
func TestBundleForkFilesOnly(t *testing.T) {
	requireStack(t)
	src := newBundle(t, "fosrc", true, "sh", "-c", "echo before > /tmp/marker; "+counterScript)
	src.start(t)
	a := src.counter(t)
	sib := newBundle(t, "fosib", false)
	sib.spec.Process.Args = []string{"sh", "-c", "echo started-fresh > /tmp/fresh; " + counterScript}
	sib.save(t)
	r := forkBundle(t, src, sib, nil, "--files-only", "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork --files-only: exit %d: %s", r.code, r.stderr)
	}
	var report struct {
		Plan struct {
			FilesOnly bool `json:"files_only"`
		}
		SourcePauseMs float64 `json:"source_pause_ms"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil || !report.Plan.FilesOnly || report.SourcePauseMs <= 0 {
		t.Fatalf("--print-stats: %v %s", err, r.stdout)
	}
	if m := sib.mustExec(t, "cat", "/tmp/marker"); m != "before" {
		t.Errorf("the sibling lacks the source's file: %q", m)
	}
	if m := sib.mustExec(t, "cat", "/tmp/fresh"); m != "started-fresh" {
		t.Errorf("the sibling did not run its own command: %q", m)
	}
	if b := src.counter(t); b <= a {
		t.Errorf("the source's counter stuck at %d", a)
	}
}
