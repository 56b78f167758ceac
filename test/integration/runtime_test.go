package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runtimes are compared on every lifecycle test: tclone must behave as crun.
var runtimes = []string{"tclone", "crun"}

func forEachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireStack(t)
			fn(t, rt)
		})
	}
}

func TestRunDetachedAndInspect(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		n := name(t, "run")
		podman(t, "run", "--runtime", rt, "-d", "--name", n, busybox, "sleep", "1000")
		if got := state(t, n); got != "running" {
			t.Fatalf("state %q, want running", got)
		}
		if got := podman(t, "inspect", "--format", "{{.OCIRuntime}}", n); got != rt {
			t.Fatalf("OCIRuntime %q, want %q", got, rt)
		}
		if pid := podman(t, "inspect", "--format", "{{.State.Pid}}", n); pid == "0" {
			t.Fatal("running container has no PID")
		}
	})
}

func TestRunRemoveExitCode(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		r := podmanTry(t, "run", "--runtime", rt, "--rm", busybox, "sh", "-c", "echo out; echo err >&2; exit 7")
		if r.code != 7 {
			t.Fatalf("exit code %d, want 7 (stderr %q)", r.code, r.stderr)
		}
		if strings.TrimSpace(r.stdout) != "out" || !strings.Contains(r.stderr, "err") {
			t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
		}
	})
}

func TestExecAndLogs(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		n := name(t, "exec")
		podman(t, "run", "--runtime", rt, "-d", "--name", n, busybox, "sh", "-c", "echo started; sleep 1000")
		if got := podman(t, "exec", n, "sh", "-c", "echo $((6*7))"); got != "42" {
			t.Fatalf("exec output %q", got)
		}
		if r := podmanTry(t, "exec", n, "sh", "-c", "exit 3"); r.code != 3 {
			t.Fatalf("exec exit code %d, want 3", r.code)
		}
		// The environment and working directory of an exec are honoured.
		if got := podman(t, "exec", "-e", "X=y", "-w", "/tmp", n, "sh", "-c", "echo $X $(pwd)"); got != "y /tmp" {
			t.Fatalf("exec env/cwd %q", got)
		}
		eventually(t, 5*time.Second, "logs", func() error {
			if got := podman(t, "logs", n); got != "started" {
				return fmt.Errorf("logs %q", got)
			}
			return nil
		})
	})
}

func TestTTYContainer(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		r := podmanTry(t, "run", "--runtime", rt, "--rm", "-t", busybox, "tty")
		if r.code != 0 || !strings.HasPrefix(strings.TrimSpace(r.stdout), "/dev/pts/") {
			t.Fatalf("tty: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
		n := name(t, "tty")
		podman(t, "run", "--runtime", rt, "-dt", "--name", n, busybox, "sh")
		if got := podman(t, "exec", "-t", n, "tty"); !strings.HasPrefix(got, "/dev/pts/") {
			t.Fatalf("exec -t tty: %q", got)
		}
	})
}

func TestStopKillRemove(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		n := name(t, "stop")
		podman(t, "run", "--runtime", rt, "-d", "--name", n, busybox, "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.1; done")
		podman(t, "stop", "-t", "5", n)
		if got := state(t, n); got != "exited" {
			t.Fatalf("after stop: %q", got)
		}
		if code := podman(t, "inspect", "--format", "{{.State.ExitCode}}", n); code != "0" {
			t.Fatalf("exit code after stop: %s", code)
		}
		podman(t, "start", n)
		podman(t, "kill", "-s", "KILL", n)
		eventually(t, 10*time.Second, "kill", func() error {
			if s := state(t, n); s != "exited" {
				return fmt.Errorf("state %q", s)
			}
			return nil
		})
		if code := podman(t, "inspect", "--format", "{{.State.ExitCode}}", n); code != "137" {
			t.Fatalf("exit code after SIGKILL: %s", code)
		}
		podman(t, "rm", n)
		if r := podmanTry(t, "container", "exists", n); r.code == 0 {
			t.Fatal("container still exists after rm")
		}
	})
}

func TestPauseUnpause(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		n := name(t, "pause")
		podman(t, "run", "--runtime", rt, "-d", "--name", n, busybox, "sh", "-c", counterScript)
		podman(t, "pause", n)
		if got := state(t, n); got != "paused" {
			t.Fatalf("after pause: %q", got)
		}
		podman(t, "unpause", n)
		if got := state(t, n); got != "running" {
			t.Fatalf("after unpause: %q", got)
		}
		a := readCounter(t, n)
		time.Sleep(500 * time.Millisecond)
		if b := readCounter(t, n); b <= a {
			t.Fatalf("counter does not advance after unpause: %d then %d", a, b)
		}
	})
}

// A checkpoint stops the container; its restore continues from where it
// stopped: the counter goes on from the checkpointed value.
func TestCheckpointRestoreContinuity(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		n := name(t, "cr")
		podman(t, "run", "--runtime", rt, "-d", "--name", n, busybox, "sh", "-c", counterScript)
		readCounter(t, n)
		podman(t, "container", "checkpoint", n)
		if got := state(t, n); got != "exited" {
			t.Fatalf("after checkpoint: %q", got)
		}
		podman(t, "container", "restore", n)
		after := readCounter(t, n)
		time.Sleep(time.Second)
		later := readCounter(t, n)
		if later <= after {
			t.Fatalf("counter stuck after restore: %d then %d", after, later)
		}
	})
}

// checkpoint --leave-running --export plus restore --import --name makes a
// second container; the source keeps running. The container holds a
// listening TCP socket (busybox httpd), which CRIU < 4.2 cannot dump on new
// kernels.
func TestCheckpointExportImportWithTCPListener(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		src := name(t, "exp")
		dst := name(t, "imp")
		podman(t, "run", "--runtime", rt, "-d", "--name", src, busybox, "sh", "-c",
			"mkdir -p /www && echo hello > /www/index.html && httpd -p 8080 -h /www && "+counterScript)
		eventually(t, 10*time.Second, "httpd up", func() error {
			if got := podmanTry(t, "exec", src, "wget", "-qO-", "http://127.0.0.1:8080/"); strings.TrimSpace(got.stdout) != "hello" {
				return fmt.Errorf("httpd answered %q", got.stdout)
			}
			return nil
		})
		before := readCounter(t, src)
		archive := filepath.Join(t.TempDir(), "cp.tar")
		podman(t, "container", "checkpoint", "--leave-running", "--export", archive, src)
		if got := state(t, src); got != "running" {
			t.Fatalf("source after --leave-running checkpoint: %q", got)
		}
		podman(t, "container", "restore", "--import", archive, "--name", dst)
		if got := podman(t, "inspect", "--format", "{{.OCIRuntime}}", dst); got != rt && rt == "crun" {
			// The host default is tclone; an imported crun checkpoint is
			// restored by the default runtime, which must handle it too.
			t.Logf("restored crun checkpoint with %s", got)
		}
		if got := readCounter(t, dst); got < before {
			t.Fatalf("restored counter %d is behind the checkpointed %d", got, before)
		}
		if got := podman(t, "exec", dst, "wget", "-qO-", "http://127.0.0.1:8080/"); got != "hello" {
			t.Fatalf("restored httpd answered %q", got)
		}
		a := readCounter(t, src)
		time.Sleep(500 * time.Millisecond)
		if b := readCounter(t, src); b <= a {
			t.Fatalf("source stopped counting: %d then %d", a, b)
		}
	})
}

func TestVersionAndHelp(t *testing.T) {
	requireStack(t)
	out := run(t, 30*time.Second, tcloneBin(), "--version")
	if out.code != 0 || !strings.Contains(out.stdout, "tclone version") || !strings.Contains(out.stdout, "crun version") {
		t.Fatalf("--version: exit %d %q", out.code, out.stdout)
	}
	// Podman decides whether a runtime can checkpoint by running this.
	if r := run(t, 30*time.Second, tcloneBin(), "checkpoint", "--help"); r.code != 0 {
		t.Fatalf("checkpoint --help: exit %d", r.code)
	}
	// ...and whether it can restore into pods by this flag in the help.
	if r := run(t, 30*time.Second, tcloneBin(), "restore", "--help"); !strings.Contains(r.stdout, "--lsm-mount-context") {
		t.Fatalf("restore --help lacks --lsm-mount-context: %q", r.stdout)
	}
	if r := run(t, 30*time.Second, tcloneBin(), "features"); r.code != 0 || !json.Valid([]byte(r.stdout)) {
		t.Fatalf("features: exit %d %q", r.code, r.stdout)
	}
}

// Errors land in --log as the JSON objects Podman parses.
func TestErrorsAreJSONInLog(t *testing.T) {
	requireStack(t)
	log := filepath.Join(t.TempDir(), "log.json")
	r := run(t, 30*time.Second, tcloneBin(), "--log", log, "--log-format", "json", "fork", "no-such-container", "x")
	if r.code == 0 {
		t.Fatal("fork of a missing container succeeded")
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var sawError bool
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if entry["level"] == "error" && strings.Contains(fmt.Sprint(entry["msg"]), "no-such-container") {
			sawError = true
		}
	}
	if !sawError {
		t.Fatalf("no error naming the container in %q", data)
	}
	if !strings.Contains(r.stderr, "no-such-container") {
		t.Fatalf("stderr does not carry the error: %q", r.stderr)
	}
}

// A missing crun, and a CRIU too old for this kernel, are refused with the
// fix named, before anything touches a container.
func TestPreflightRefusals(t *testing.T) {
	requireStack(t)
	r := runEnv(t, []string{"TCLONE_CRUN=/nonexistent/crun"}, tcloneBin(), "state", "x")
	if r.code == 0 || !strings.Contains(r.stderr, "crun") {
		t.Fatalf("missing crun: exit %d %q", r.code, r.stderr)
	}
	// A CRIU that says it is 4.1.1, over its RPC as tclone asks.
	fake := filepath.Join(binDir(), "oldcriu")
	if _, err := os.Stat(fake); err != nil {
		t.Fatalf("oldcriu: %v (make build puts it in TCLONE_BINDIR)", err)
	}
	n := name(t, "pre")
	podman(t, "run", "-d", "--name", n, busybox, "sleep", "1000")
	id := containerID(t, n)
	r = runEnv(t, []string{"TCLONE_CRIU=" + fake}, tcloneBin(), "checkpoint", "--image-path", t.TempDir(), "--leave-running", id)
	if r.code == 0 || !strings.Contains(r.stderr, "too old") || !strings.Contains(r.stderr, "4.2") {
		t.Fatalf("old criu: exit %d %q", r.code, r.stderr)
	}
	if got := state(t, n); got != "running" {
		t.Fatalf("container after refused checkpoint: %q", got)
	}
}

func runEnv(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		old, had := os.LookupEnv(k)
		os.Setenv(k, v)
		defer func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		}()
	}
	return run(t, time.Minute, name, args...)
}

// A container run with --init (Podman binds its catatonit at
// /run/podman-init, a symbolic link on Debian) forks, and an ordinary
// checkpoint of it restores through tclone: CRIU cannot take a bind mount
// whose source is a link, so tclone gives crun the link's target. The
// ordinary checkpoint is taken after the fork, in the checkpoint directory
// where the fork left its plan's reference: it must not read as a fork's.
func TestInitContainerForksAndRestores(t *testing.T) {
	requireStack(t)
	src := name(t, "init")
	dst := name(t, "initimp")
	podman(t, "run", "--runtime", "tclone", "--init", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	before := readCounter(t, src)
	r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
	if r.code != 0 {
		t.Fatalf("fork of an --init container: exit %d: %s", r.code, r.stderr)
	}
	archive := filepath.Join(t.TempDir(), "cp.tar")
	podman(t, "container", "checkpoint", "--leave-running", "--export", archive, src)
	podman(t, "container", "restore", "--import", archive, "--name", dst)
	for _, ctr := range []string{src + "-f", dst} {
		if got := readCounter(t, ctr); got < before {
			t.Errorf("%s: counter %d is behind the source's %d", ctr, got, before)
		}
		a := readCounter(t, ctr)
		time.Sleep(500 * time.Millisecond)
		if b := readCounter(t, ctr); b <= a {
			t.Errorf("%s: the counter stopped: %d then %d", ctr, a, b)
		}
		if comm := podman(t, "exec", ctr, "cat", "/proc/1/comm"); comm != "podman-init" {
			t.Errorf("%s: process 1 is %q, want Podman's init", ctr, comm)
		}
	}
}

// A container given a Podman secret (a file bind-mounted inside the bind
// mount of /run/secrets) forks, and the sibling reads the secret: the
// mountpoint crun made in the source's directory is made in the sibling's.
func TestSecretContainerForks(t *testing.T) {
	requireStack(t)
	secret := uniqueName("secret")
	value := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(value, []byte("s3cr3t-value"), 0o600); err != nil {
		t.Fatal(err)
	}
	podman(t, "secret", "create", secret, value)
	t.Cleanup(func() { podmanTry(t, "secret", "rm", secret) })
	src := name(t, "secret")
	podman(t, "run", "-d", "--name", src, "--secret", secret, busybox, "sh", "-c", counterScript)
	if r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src); r.code != 0 {
		t.Fatalf("fork of a container with a secret: exit %d: %s", r.code, r.stderr)
	}
	for _, ctr := range []string{src, src + "-f"} {
		if got := podman(t, "exec", ctr, "cat", "/run/secrets/"+secret); got != "s3cr3t-value" {
			t.Errorf("%s reads %q from its secret", ctr, got)
		}
	}
}

// A container sharing the host's PID namespace cannot be forked by Podman
// (its sibling would share it too, where the source's PIDs are taken): the
// fork says so before the source is held, and makes nothing.
func TestForkOfHostPIDContainerRefused(t *testing.T) {
	requireStack(t)
	src := name(t, "hostpid")
	podman(t, "run", "-d", "--name", src, "--pid", "host", busybox, "sh", "-c", counterScript)
	r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
	if r.code == 0 || !strings.Contains(r.stderr, "--pid=host") {
		t.Fatalf("fork of a --pid=host container: exit %d: %s; want a refusal naming --pid=host", r.code, r.stderr)
	}
	if podmanTry(t, "container", "exists", src+"-f").code == 0 {
		t.Error("the refused fork made a sibling")
	}
	a := readCounter(t, src)
	time.Sleep(500 * time.Millisecond)
	if b := readCounter(t, src); b <= a {
		t.Errorf("the source stopped counting after the refusal: %d then %d", a, b)
	}
}
