package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/journal"
)

// shellImage has a shell and nothing else: no `true`, no coreutils.
const shellImage = "localhost/tclone-shell:latest"

// requireShellImage builds the shell-only image when the set-up has not.
func requireShellImage(t *testing.T) {
	t.Helper()
	if podmanTry(t, "image", "exists", shellImage).code == 0 {
		return
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "tmp", "proc", "sys", "dev", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("building %s needs busybox-static: %v", shellImage, err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "sh"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `tar -C "$1" -c . | /usr/bin/podman import --quiet - "$2"`, "sh", root, shellImage)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v: %s", shellImage, err, out)
	}
}

// shellCounter counts in /tmp/c with nothing but the shell.
const shellCounter = `i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done`

// shellSource runs a counter in the shell-only image.
func shellSource(t *testing.T) string {
	t.Helper()
	requireShellImage(t)
	src := name(t, "sh")
	podman(t, "run", "-d", "--name", src, shellImage, "/bin/sh", "-c", shellCounter)
	return src
}

// shellCount reads the counter of a shell-only container with a builtin.
func shellCount(t *testing.T, ctr string) int {
	t.Helper()
	var n int
	eventually(t, 10*time.Second, "counter of "+ctr, func() error {
		r := podmanTry(t, "exec", ctr, "/bin/sh", "-c", "read v < /tmp/c; echo $v")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		_, err := fmt.Sscan(r.stdout, &n)
		return err
	})
	return n
}

// A source whose image has only a shell forks with the default readiness;
// --ready exec fails saying what is missing and what to use instead, with
// none of the service's attach noise, and leaves nothing.
func TestPodmanForkShellOnlyImage(t *testing.T) {
	requireStack(t)
	src := shellSource(t)
	shellCount(t, src)

	r := forkCLI(t, "--print-stats", "--hook", "echo hooked > /tmp/h", src)
	if r.code != 0 {
		t.Fatalf("default fork of a shell-only image: exit %d: %s", r.code, r.stderr)
	}
	var st struct {
		Siblings []map[string]any `json:"siblings"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("stats %v %q", err, r.stdout)
	}
	sib := st.Siblings[0]["name"].(string)
	if got := state(t, sib); got != "running" {
		t.Fatalf("sibling %s: %s", sib, got)
	}
	a := shellCount(t, sib)
	time.Sleep(500 * time.Millisecond)
	if b := shellCount(t, sib); b <= a {
		t.Fatalf("sibling counter stuck at %d", a)
	}
	if got := podman(t, "exec", sib, "/bin/sh", "-c", "read v < /tmp/h; echo $v"); got != "hooked" {
		t.Errorf("hook output %q", got)
	}

	before := siblingsOf(t, src)
	r = forkCLI(t, "--ready", "exec", src)
	if r.code == 0 {
		t.Fatal("--ready exec succeeded in an image without `true`")
	}
	for _, want := range []string{`"true"`, "--ready running"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the error does not say %s: %q", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "unixpacket") || strings.Contains(r.stderr, "/attach") {
		t.Errorf("the service's attach error reached the user: %q", r.stderr)
	}
	if after := siblingsOf(t, src); len(after) != len(before) {
		t.Errorf("siblings after a failed fork: %v, before %v", after, before)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)

	// An image with one binary and no shell forks too; a hook, which
	// needs sh, fails saying so.
	nosh := noShellSource(t)
	if r := forkCLI(t, nosh); r.code != 0 {
		t.Fatalf("default fork of an image without a shell: %s", r.stderr)
	}
	r = forkCLI(t, "--name", nosh+"-h", "--hook", "echo hi", nosh)
	if r.code == 0 || !strings.Contains(r.stderr, "no sh") {
		t.Errorf("a hook in an image without a shell: exit %d %q", r.code, r.stderr)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// noShellSource runs a container whose image holds one static binary,
// /bin/busybox, and no shell; the image is removed after the test.
func noShellSource(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"bin", "tmp", "proc", "sys", "dev", "etc"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "bin", "busybox"), bb, 0o755)
	img := "localhost/" + name(t, "nosh-img")
	cmd := exec.Command("sh", "-c", `tar -C "$1" -c . | /usr/bin/podman import --quiet - "$2"`, "sh", root, img)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v: %s", img, err, out)
	}
	src := name(t, "nosh")
	t.Cleanup(func() { podmanTry(t, "rmi", "-f", img) })
	podman(t, "run", "-d", "--name", src, img, "/bin/busybox", "sleep", "1000")
	return src
}

// execConmons lists the conmon processes that serve exec sessions of a
// container.
func execConmons(t *testing.T, id string) []int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if filepath.Base(args[0]) != "conmon" {
			continue
		}
		var ctr, exec bool
		for i, a := range args {
			ctr = ctr || (a == "-c" && i+1 < len(args) && args[i+1] == id)
			exec = exec || a == "--exec-attach"
		}
		if ctr && exec {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
			pids = append(pids, pid)
		}
	}
	return pids
}

// A readiness or hook exec leaves no conmon behind for Podman's exit delay.
func TestPodmanForkExecLeavesNoConmon(t *testing.T) {
	requireStack(t)
	src := name(t, "exec")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	r := forkCLI(t, "--ready", "exec", "--hook", "true", "--format", "json", src)
	if r.code != 0 {
		t.Fatalf("fork: %s", r.stderr)
	}
	var res []struct {
		ID             string  `json:"id"`
		FirstCommandMs float64 `json:"first_command_ms"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res) != 1 {
		t.Fatalf("%v %q", err, r.stdout)
	}
	if res[0].FirstCommandMs <= 0 {
		t.Errorf("first_command_ms %v after a hook and an exec", res[0].FirstCommandMs)
	}
	eventually(t, 10*time.Second, "no exec conmon", func() error {
		if pids := execConmons(t, res[0].ID); len(pids) > 0 {
			return fmt.Errorf("exec conmons of the sibling still run: %v", pids)
		}
		return nil
	})
}

// liveCalls lists the fork call records that are not lingering tombstones
// of a finished rollback.
func liveCalls(t *testing.T) []string {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(hostStore.CallsDir(), "*.json*"))
	var out []string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var rec calls.Record
		if json.Unmarshal(data, &rec) == nil && rec.RolledBack.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

func requireNoLiveCalls(t *testing.T) {
	t.Helper()
	if l := liveCalls(t); len(l) > 0 {
		t.Fatalf("fork call records left: %v", l)
	}
}

// clientDirs lists the temporary directories that name pid as their owner.
func clientDirs(pid int) map[string]calls.DirOwner {
	out := map[string]calls.DirOwner{}
	for _, prefix := range calls.TempPrefixes {
		dirs, _ := filepath.Glob(filepath.Join(hostStore.TempDir(), prefix+"*"))
		for _, d := range dirs {
			data, err := os.ReadFile(filepath.Join(d, calls.OwnerFile))
			if err != nil {
				continue
			}
			var o calls.DirOwner
			if json.Unmarshal(data, &o) == nil && o.Owner.Pid == pid {
				out[d] = o
			}
		}
	}
	return out
}

func processGone(o journal.Owner) bool { return !o.Running() }

// Kill podman-fork with SIGKILL once its first sibling exists: its private
// Podman service exits by itself, and the next fork (first round) or the
// function tclone gc runs (second round) leaves no sibling of the killed
// call, no service, no temporary directory and no call record.
func TestPodmanForkKilledClient(t *testing.T) {
	requireStack(t)
	for _, cleaner := range []string{"next-fork", "gc"} {
		t.Run(cleaner, func(t *testing.T) {
			src := name(t, "killed")
			podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
			readCounter(t, src)
			cmd := exec.Command(podmanForkBin(), "--private-service", "--count", "3", "--hook", "sleep 5", src)
			cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			var service journal.Owner
			eventually(t, 60*time.Second, "first sibling made", func() error {
				for _, o := range clientDirs(pid) {
					if o.Service != nil {
						service = *o.Service
					}
				}
				if service.Pid == 0 {
					return fmt.Errorf("no private service recorded yet")
				}
				if len(siblingsOf(t, src)) == 0 {
					return fmt.Errorf("no sibling yet")
				}
				return nil
			})
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()

			eventually(t, 30*time.Second, "the private service exits with its client", func() error {
				if !processGone(service) {
					return fmt.Errorf("service %d still runs", service.Pid)
				}
				return nil
			})
			if cleaner == "gc" {
				rep, err := calls.Collect(context.Background(), hostStore)
				if err != nil {
					t.Fatalf("collecting: %v", err)
				}
				if len(rep.Calls) != 1 || len(rep.Calls[0].Siblings) == 0 {
					t.Errorf("report %+v", rep)
				}
			} else if r := forkCLI(t, "--name", src+"-next", src); r.code != 0 {
				t.Fatalf("the next fork: exit %d: %s", r.code, r.stderr)
			}
			left := siblingsOf(t, src)
			if cleaner == "next-fork" && (len(left) != 1 || left[0] != src+"-next") {
				t.Fatalf("siblings after the next fork: %v", left)
			}
			if cleaner == "gc" && len(left) != 0 {
				t.Fatalf("siblings after collection: %v", left)
			}
			if dirs := clientDirs(pid); len(dirs) > 0 {
				t.Errorf("the dead client's directories are left: %v", dirs)
			}
			requireNoLiveCalls(t)
			requireNoLeftovers(t)
			if got := state(t, src); got != "running" {
				t.Fatalf("source: %s", got)
			}
		})
	}
}

// Kill podman-fork with SIGKILL while the system service restores its
// first sibling: the service finishes that request on its own, and the next
// fork removes the container it made, which the dead client never learned
// the ID of (it carries the call's label).
func TestPodmanForkKilledClientMidRestore(t *testing.T) {
	requireStack(t)
	if !socketAnswers("/run/podman/podman.sock") {
		t.Fatal("no system Podman service (hack/podman-service.sh start)")
	}
	src := demoWorkspace(t)
	cmd := exec.Command(podmanForkBin(), "--count", "2", "--parallel", "1", src)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "first sibling created", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	made := siblingsOf(t, src)
	for _, m := range made {
		t.Logf("the killed call left %s (%s)", m, state(t, m))
	}
	if r := forkCLI(t, "--name", src+"-next", src); r.code != 0 {
		t.Fatalf("the next fork: exit %d: %s", r.code, r.stderr)
	}
	if left := siblingsOf(t, src); len(left) != 1 || left[0] != src+"-next" {
		t.Fatalf("siblings %v after the next fork (the killed call had made %v)", left, made)
	}
	if dirs := clientDirs(cmd.Process.Pid); len(dirs) > 0 {
		t.Errorf("the dead client's directories are left: %v", dirs)
	}
	requireNoLiveCalls(t)
	requireNoLeftovers(t)
}

func socketAnswers(path string) bool {
	r := exec.Command("curl", "-sf", "--max-time", "2", "--unix-socket", path, "http://d/_ping")
	return r.Run() == nil
}

// Eight forks of one source at once, with default names: all succeed, with
// distinct names, and every sibling any of them reported still exists.
func TestPodmanForkConcurrentDefaultNames(t *testing.T) {
	requireStack(t)
	src := name(t, "conc")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	const n = 8
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = forkCLI(t, "--format", "json", src)
		}()
	}
	wg.Wait()
	names := map[string]string{}
	for i, r := range results {
		if r.code != 0 {
			t.Errorf("fork %d: exit %d: %s", i, r.code, r.stderr)
			continue
		}
		var res []struct{ ID, Name string }
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res) != 1 {
			t.Fatalf("fork %d: %v %q", i, err, r.stdout)
		}
		if prev, dup := names[res[0].Name]; dup {
			t.Errorf("two forks reported %s (%s and %s)", res[0].Name, prev, res[0].ID)
		}
		names[res[0].Name] = res[0].ID
	}
	for n, id := range names {
		if got := containerID(t, n); got != id {
			t.Errorf("%s: reported %s, now %s", n, id, got)
		}
	}
	got := siblingsOf(t, src)
	sort.Strings(got)
	if len(got) != n {
		t.Errorf("siblings %v, want %d", got, n)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// A name that exists fails the fork with Podman's error and the container
// holding it is left alone, even when it is a sibling of the same source
// (which a rollback by name would have taken for its own).
func TestPodmanForkNameClash(t *testing.T) {
	requireStack(t)
	src := name(t, "clash")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	sib := src + "-x"
	if r := forkCLI(t, "--name", sib, src); r.code != 0 {
		t.Fatalf("first fork: %s", r.stderr)
	}
	id := containerID(t, sib)
	podman(t, "exec", sib, "sh", "-c", "echo precious > /tmp/data")

	r := forkCLI(t, "--name", sib, src)
	if r.code == 0 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("a fork onto an existing name: exit %d: %q", r.code, r.stderr)
	}
	if got := containerID(t, sib); got != id {
		t.Fatalf("%s was replaced or removed: ID %s, was %s", sib, got, id)
	}
	if got := podman(t, "exec", sib, "cat", "/tmp/data"); got != "precious" {
		t.Fatalf("%s lost its data: %q", sib, got)
	}

	// A default name held by a container that is no fork: the fork takes
	// the next number and leaves it alone.
	squatter := src + "-fork-1"
	podman(t, "run", "-d", "--name", squatter, "--label", "io.tclone.forked-from="+containerID(t, src), busybox, "sleep", "1000")
	sq := containerID(t, squatter)
	r = forkCLI(t, "--format", "json", src)
	if r.code != 0 {
		t.Fatalf("default-named fork: %s", r.stderr)
	}
	if !strings.Contains(r.stdout, src+"-fork-2") {
		t.Errorf("default name: %s", r.stdout)
	}
	if containerID(t, squatter) != sq {
		t.Fatal("the container holding the default name was touched")
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// An option error must come before anything is started: this is how long a
// refused call may take.
const refusalTime = 3 * time.Second

func refused(t *testing.T, args ...string) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(podmanForkBin(), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		t.Errorf("%v accepted", args)
	}
	if d := time.Since(start); d > refusalTime {
		t.Errorf("%v took %s to be refused", args, d)
	}
	return stderr.String()
}
