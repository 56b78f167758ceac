package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Bare OCI bundles: the runtime-level fork (`tclone fork SRC NEW --bundle`)
// is tested without Podman, with tclone's delegated run and crun's state.

var (
	rootfsOnce sync.Once
	rootfsDir  string
	rootfsErr  error
)

// busyboxRootfs exports the busybox image once per test run.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("TCLONE_TEST_ROOTFS"); dir != "" {
		return dir
	}
	rootfsOnce.Do(func() {
		dir, err := os.MkdirTemp("/var/tmp", "tclone-test-rootfs-")
		if err != nil {
			rootfsErr = err
			return
		}
		out, err := exec.Command("sh", "-c", fmt.Sprintf(
			"set -e; c=$(podman create %s true); podman export $c | tar -C %s -x; podman rm $c >/dev/null", busybox, dir)).CombinedOutput()
		if err != nil {
			rootfsErr = fmt.Errorf("exporting %s: %v: %s", busybox, err, out)
		}
		rootfsDir = dir
	})
	if rootfsErr != nil {
		t.Fatal(rootfsErr)
	}
	return rootfsDir
}

// bundle is a bare OCI bundle and the container run from it.
type bundle struct {
	dir  string
	id   string
	spec *specs.Spec
}

func (b *bundle) rootfs() string { return filepath.Join(b.dir, "rootfs") }

// newBundle makes a bundle whose root is a copy of busybox (or empty, for a
// sibling), with its own hostname and cgroup.
func newBundle(t *testing.T, role string, populate bool, args ...string) *bundle {
	t.Helper()
	// A crun container, not Podman's: b.remove takes it away.
	id := uniqueName(role)
	dir := filepath.Join(t.TempDir(), id)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if populate {
		if out, err := exec.Command("cp", "-a", busyboxRootfs(t)+"/.", filepath.Join(dir, "rootfs")).CombinedOutput(); err != nil {
			t.Fatalf("copying rootfs: %v: %s", err, out)
		}
	}
	if out, err := exec.Command("crun", "spec", "-b", dir).CombinedOutput(); err != nil {
		t.Fatalf("crun spec: %v: %s", err, out)
	}
	b := &bundle{dir: dir, id: id}
	b.load(t)
	b.spec.Process.Terminal = false
	b.spec.Process.Args = args
	b.spec.Hostname = role
	b.spec.Root.Readonly = false
	b.spec.Linux.CgroupsPath = "/tclone-test/" + id
	b.save(t)
	t.Cleanup(func() { b.remove(t) })
	return b
}

func (b *bundle) load(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(b.dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	b.spec = &specs.Spec{}
	if err := json.Unmarshal(data, b.spec); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) save(t *testing.T) {
	t.Helper()
	data, _ := json.MarshalIndent(b.spec, "", " ")
	if err := os.WriteFile(filepath.Join(b.dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs the bundle's container detached through tclone (which hands
// it to crun).
func (b *bundle) start(t *testing.T) {
	t.Helper()
	// The container inherits stdio: /dev/null, as a pipe would make
	// waiting for the command wait for the container, and CRIU cannot dump
	// a host file outside the container's mounts. crun's errors go to --log.
	log := filepath.Join(t.TempDir(), "run.log")
	cmd := exec.Command(tcloneBin(), "--log", log, "run", "--detach", "--bundle", b.dir, b.id)
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(log)
		t.Fatalf("tclone run %s: %v: %s", b.id, err, msg)
	}
}

func (b *bundle) remove(t *testing.T) {
	exec.Command("crun", "delete", "--force", b.id).Run()
	// crun removes the cgroup; a failed restore may have left one.
	for _, ctl := range []string{"freezer", "memory", "pids", "cpu", "cpuacct", "cpuset", "devices", "blkio", "hugetlb", "systemd", "unified"} {
		os.Remove(filepath.Join("/sys/fs/cgroup", ctl, "tclone-test", b.id))
	}
}

// exec runs a command in the bundle's container through tclone.
func (b *bundle) exec(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, time.Minute, tcloneBin(), append([]string{"exec", b.id}, args...)...)
}

func (b *bundle) mustExec(t *testing.T, args ...string) string {
	t.Helper()
	r := b.exec(t, args...)
	if r.code != 0 {
		t.Fatalf("exec %v in %s: exit %d: %s", args, b.id, r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

func (b *bundle) counter(t *testing.T) int {
	t.Helper()
	var n int
	eventually(t, 10*time.Second, "counter of "+b.id, func() error {
		r := b.exec(t, "cat", "/tmp/c")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		_, err := fmt.Sscan(r.stdout, &n)
		return err
	})
	return n
}

// crunState returns crun's status for id, or "" when crun does not know it.
func crunState(t *testing.T, id string) string {
	r := run(t, time.Minute, "crun", "state", id)
	if r.code != 0 {
		return ""
	}
	var st struct{ Status string }
	json.Unmarshal([]byte(r.stdout), &st)
	return st.Status
}

// forkBundle runs `tclone fork` of src into a new sibling bundle.
func forkBundle(t *testing.T, src *bundle, sib *bundle, env []string, extra ...string) result {
	t.Helper()
	args := append([]string{"fork", "--bundle", sib.dir}, extra...)
	args = append(args, src.id, sib.id)
	return runDetached(t, env, tcloneBin(), args...)
}

// runDetached runs a command whose descendants outlive it holding its
// stdio (a restored sibling inherits tclone's): its output goes through
// files, not pipes, so waiting for it does not wait for them.
func runDetached(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	dir := t.TempDir()
	stdout, _ := os.Create(filepath.Join(dir, "stdout"))
	stderr, _ := os.Create(filepath.Join(dir, "stderr"))
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, stdout, stderr
	err := cmd.Start()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("%s %s: timed out", name, strings.Join(args, " "))
	}
	stdout.Close()
	stderr.Close()
	r := result{}
	if b, err := os.ReadFile(stdout.Name()); err == nil {
		r.stdout = string(b)
	}
	if b, err := os.ReadFile(stderr.Name()); err == nil {
		r.stderr = string(b)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.code = 128 + int(ws.Signal())
		}
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

type specsMount = specs.Mount
