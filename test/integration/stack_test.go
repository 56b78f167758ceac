// Package integration tests tclone against the real stack: Podman, conmon,
// crun and CRIU, as root. `make test` runs it with
// TCLONE_REQUIRE=1 (test/testenv), which turns a missing piece from a skip into
// a failure, so CI never passes by skipping.
package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/test/testenv"
)

const (
	busybox   = "localhost/tclone-busybox:latest"
	workspace = "localhost/tclone-workspace:latest"
)

// requireStack skips (or, under TCLONE_REQUIRE=1, fails) a test
// when the machine lacks what it needs.
func requireStack(t *testing.T) {
	t.Helper()
	missing := missingTools("/usr/bin/podman", "crun", "criu", "conmon", tcloneBin(), podmanForkBin())
	for _, img := range []string{busybox, workspace} {
		if exec.Command("/usr/bin/podman", "image", "exists", img).Run() != nil {
			missing = append(missing, "image "+img)
		}
	}
	stackMissing(t, missing)
}

// requireBundleStack is requireStack for the runtime-level tests of bare
// bundles: crun, CRIU and tclone, no Podman (the kernel VM runs them so, on
// pure cgroup v2, with TCLONE_TEST_ROOTFS naming a busybox root).
func requireBundleStack(t *testing.T) {
	t.Helper()
	missing := missingTools("crun", "criu", tcloneBin())
	if os.Getenv("TCLONE_TEST_ROOTFS") == "" {
		if exec.Command("/usr/bin/podman", "image", "exists", busybox).Run() != nil {
			missing = append(missing, "image "+busybox+" (or TCLONE_TEST_ROOTFS)")
		}
	}
	stackMissing(t, missing)
}

func missingTools(bins ...string) []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	return missing
}

func stackMissing(t *testing.T, missing []string) {
	t.Helper()
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("missing %s (run hack/setup-host.sh)", strings.Join(missing, ", "))
	testenv.Missing(t, "%s", msg)
}

func binDir() string {
	if d := os.Getenv("TCLONE_BINDIR"); d != "" {
		return d
	}
	return "/usr/local/bin"
}

func tcloneBin() string     { return filepath.Join(binDir(), "tclone") }
func podmanForkBin() string { return filepath.Join(binDir(), "podman-fork") }
func workloadBin() string   { return filepath.Join(binDir(), "workload") }

// result is a finished command.
type result struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, timeout time.Duration, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// On a timeout, say what the command was waiting for: the processes it
	// started, and (for Go programs) every goroutine's stack, which SIGQUIT
	// prints to stderr before the process exits.
	var tree string
	cmd.Cancel = func() error {
		tree = processTree(cmd.Process.Pid)
		return cmd.Process.Signal(syscall.SIGQUIT)
	}
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ctx.Err() != nil {
		t.Fatalf("%s %s: timed out after %s\nprocesses:\n%s\nstderr: %s", name, strings.Join(args, " "), timeout, tree, r.stderr)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return r
}

// podman runs the real podman and fails the test on a non-zero exit.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, 3*time.Minute, "/usr/bin/podman", args...)
	if r.code != 0 {
		t.Fatalf("podman %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// podmanTry runs podman and returns the result whatever the exit status.
func podmanTry(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, 3*time.Minute, "/usr/bin/podman", args...)
}

// name returns a container name unique to this test run, and removes the
// container when the test ends.
func name(t *testing.T, prefix string) string {
	t.Helper()
	n := uniqueName(prefix)
	t.Cleanup(func() { removeContainers(t, n) })
	return n
}

// uniqueName is tct-PREFIX-RANDOM: a name of this run's, for a container, a
// network or a volume, that the leak check at the end recognises.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("tct-%s-%s", prefix, hex.EncodeToString(b))
}

// removeContainers removes containers and anything forked from them.
func removeContainers(t *testing.T, names ...string) {
	for _, n := range names {
		ids := strings.Fields(podmanTry(t, "ps", "-aq", "--filter", "label=io.tclone.forked-from="+containerID(t, n)).stdout)
		// With their anonymous volumes: a sibling's copies of volumes.
		for _, id := range ids {
			podmanTry(t, "rm", "-f", "-v", "-t", "0", id)
		}
		podmanTry(t, "rm", "-f", "-v", "-t", "0", n)
	}
}

func containerID(t *testing.T, name string) string {
	r := podmanTry(t, "inspect", "--format", "{{.Id}}", name)
	if r.code != 0 {
		return "none"
	}
	return strings.TrimSpace(r.stdout)
}

// inspect decodes `podman inspect` of one container.
func inspect(t *testing.T, name string) map[string]any {
	t.Helper()
	var out []map[string]any
	if err := json.Unmarshal([]byte(podman(t, "inspect", name)), &out); err != nil || len(out) != 1 {
		t.Fatalf("inspect %s: %v", name, err)
	}
	return out[0]
}

func state(t *testing.T, name string) string {
	t.Helper()
	return podman(t, "inspect", "--format", "{{.State.Status}}", name)
}

// eventually retries fn until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// counterScript counts in /tmp/c ten times a second.
const counterScript = `i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done`

// readCounter reads the counter of a container running counterScript.
func readCounter(t *testing.T, name string) int {
	t.Helper()
	var n int
	eventually(t, 10*time.Second, "reading the counter of "+name, func() error {
		out := podmanTry(t, "exec", name, "cat", "/tmp/c")
		if out.code != 0 {
			return fmt.Errorf("exit %d: %s", out.code, out.stderr)
		}
		_, err := fmt.Sscan(out.stdout, &n)
		return err
	})
	return n
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// processTree lists pid and its descendants, and every process of the stack,
// with their command lines and wait channels, as ps shows them.
func processTree(pid int) string {
	out, err := exec.Command("ps", "-e", "-o", "pid,ppid,stat,wchan:24,args", "--forest").Output()
	if err != nil {
		return fmt.Sprintf("(ps: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	want := map[string]bool{fmt.Sprint(pid): true}
	var keep []string
	if len(lines) > 0 {
		keep = append(keep, lines[0])
	}
	for _, l := range lines[1:] { // --forest lists children after parents
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		if want[f[0]] || want[f[1]] || stackTool(l) {
			want[f[0]] = true
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// stackTool reports whether a ps line is one of the stack's own processes,
// which a stuck command may be waiting for even though it did not start it.
func stackTool(line string) bool {
	for _, tool := range []string{"podman", "conmon", "crun", "criu", "tclone"} {
		if strings.Contains(line, tool) {
			return true
		}
	}
	return false
}

// poke asks a test program in container ctr for a report: it removes the
// last one, at path, creates /tmp/go, which the program waits for, and
// returns what the program writes at path.
func poke(t *testing.T, ctr, path string) string {
	t.Helper()
	podman(t, "exec", ctr, "rm", "-f", path)
	podman(t, "exec", ctr, "touch", "/tmp/go")
	var out string
	eventually(t, 10*time.Second, ctr+": "+path, func() error {
		r := podmanTry(t, "exec", ctr, "cat", path)
		out = r.stdout
		if r.code != 0 {
			return fmt.Errorf("%s", r.stderr)
		}
		return nil
	})
	return out
}
