package crun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// execCommand makes the re-executed test binary call Exec with the crun
// at os.Args[2]: Exec replaces the process, which the test process cannot
// let happen to itself.
const execCommand = "crun-test-exec"

func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == execCommand {
		r := &Runtime{Path: os.Args[2], Global: Global{Root: "/r", Debug: true}}
		fmt.Println(r.Exec("kill", []string{"id", "TERM"}, []string{"BAZ=qux", "OVER=new"}))
		os.Exit(99)
	}
	os.Exit(m.Run())
}

func TestArgs(t *testing.T) {
	var a Args
	a.Flag("--off", false)
	a.Value("--empty", "")
	a.Assign("--empty", "")
	if len(a) != 0 {
		t.Errorf("unset flags rendered as %q", a)
	}
	a.Flag("--on", true)
	a.Value("--bundle", "/b")
	a.Assign("--root", "/r")
	if want := (Args{"--on", "--bundle", "/b", "--root=/r"}); !slices.Equal(a, want) {
		t.Errorf("got %q, want %q", a, want)
	}
}

func TestStateRoot(t *testing.T) {
	if got := (Global{}).StateRoot(); got != "/run/crun" {
		t.Errorf("default state root %q, want crun's /run/crun", got)
	}
	if got := (Global{Root: "/run/x"}).StateRoot(); got != "/run/x" {
		t.Errorf("state root with --root=/run/x: %q", got)
	}
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "crun")
	plain := filepath.Join(dir, "plain")
	for file, mode := range map[string]os.FileMode{exe: 0o755, plain: 0o644} {
		if err := os.WriteFile(file, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	g := Global{Root: "/r"}

	t.Setenv(EnvBinary, exe)
	if r, err := Find(g); err != nil || r.Path != exe || r.Global != g {
		t.Errorf("$%s=%s: %+v, %v", EnvBinary, exe, r, err)
	}
	for _, bad := range []string{plain, dir} {
		t.Setenv(EnvBinary, bad)
		want := "crun from $" + EnvBinary + ": " + bad + " is not an executable file"
		if _, err := Find(g); err == nil || err.Error() != want {
			t.Errorf("$%s=%s: %v, want %q", EnvBinary, bad, err, want)
		}
	}
	t.Setenv(EnvBinary, filepath.Join(dir, "missing"))
	if _, err := Find(g); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("$%s naming no file: %v, want not-exist", EnvBinary, err)
	}

	t.Setenv(EnvBinary, "")
	t.Setenv("PATH", dir)
	if r, err := Find(g); err != nil || r.Path != exe {
		t.Errorf("crun in PATH %s: %+v, %v; want %s", dir, r, err, exe)
	}
	// Without crun in PATH, the usual install locations are tried.
	t.Setenv("PATH", t.TempDir())
	r, err := Find(g)
	installed := []string{"/usr/bin/crun", "/usr/local/bin/crun", "/usr/sbin/crun"}
	switch {
	case err == nil && !slices.Contains(installed, r.Path):
		t.Errorf("crun found at %s, which is no install location", r.Path)
	case err != nil && !strings.Contains(err.Error(), "point $"+EnvBinary+" at the binary"):
		t.Errorf("no crun: %v, want advice on where to get one", err)
	}
}

// Global flags go before the verb, as crun reads them.
func TestCommandArgv(t *testing.T) {
	r := &Runtime{Path: "/bin/crun", Global: Global{Root: "/r", Debug: true}}
	cmd := r.Command(context.Background(), "kill", "id", "TERM")
	want := []string{"/bin/crun", "--debug", "--root=/r", "kill", "id", "TERM"}
	if cmd.Path != "/bin/crun" || !slices.Equal(cmd.Args, want) {
		t.Errorf("command %s %q, want %q", cmd.Path, cmd.Args, want)
	}
}

func TestOutput(t *testing.T) {
	r := fakeCrun(t, `echo "$*"; echo noise >&2`)
	out, err := r.Output(context.Background(), "state", "x")
	if want := "--root=" + r.Global.Root + " state x\n"; err != nil || string(out) != want {
		t.Errorf("Output = %q, %v; want standard output alone, %q", out, err, want)
	}
}

// A crun that fails is an ExitError saying why in crun's words, or its
// status if it said nothing.
func TestOutputExitError(t *testing.T) {
	for script, want := range map[string]string{
		"echo '  boom ' >&2; exit 3": "crun state: boom",
		"exit 3":                     "crun state: exit status 3",
	} {
		_, err := fakeCrun(t, script).Output(context.Background(), "state", "x")
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 3 || ee.Verb != "state" || err.Error() != want {
			t.Errorf("%s: %v (%#v), want an ExitError %q", script, err, err, want)
		}
	}
	r := &Runtime{Path: filepath.Join(t.TempDir(), "missing")}
	_, err := r.Output(context.Background(), "state", "x")
	var ee *ExitError
	if err == nil || errors.As(err, &ee) || !strings.HasPrefix(err.Error(), "crun state: ") {
		t.Errorf("crun that cannot start: %v, want an error that is no ExitError", err)
	}
}

// Version is all crun --version prints (crun's version, commit, and
// features), asked without global flags.
func TestVersion(t *testing.T) {
	v, err := fakeCrun(t, `echo "crun version 1.2 ($*)"; echo "commit: abc"`).Version(context.Background())
	if want := "crun version 1.2 (--version)\ncommit: abc\n"; err != nil || v != want {
		t.Errorf("Version = %q, %v; want %q", v, err, want)
	}
	if _, err := fakeCrun(t, "exit 1").Version(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "crun --version: ") {
		t.Errorf("failing crun --version: %v", err)
	}
}

// Exec becomes crun: same process, the caller's environment with Exec's
// added (replacing the caller's variable of the same name), its
// descriptors, and crun's exit status.
func TestExec(t *testing.T) {
	script := filepath.Join(t.TempDir(), "crun")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$$ $0 $* $FOO $BAZ $OVER $(env | grep -c ^OVER=)\"\necho three >&3\nexit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(os.Args[0], execCommand, script)
	cmd.Env = append(os.Environ(), "FOO=bar", "OVER=old")
	cmd.ExtraFiles = []*os.File{w}
	out, err := cmd.Output()
	w.Close()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("%v (output %q), want crun's exit status 7", err, out)
	}
	want := strconv.Itoa(cmd.Process.Pid) + " " + script + " --debug --root=/r kill id TERM bar qux new 1\n"
	if string(out) != want {
		t.Errorf("crun printed %q, want %q", out, want)
	}
	if three, _ := io.ReadAll(r); string(three) != "three\n" {
		t.Errorf("crun wrote %q to the inherited descriptor 3", three)
	}
}

func TestExecFailure(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "crun")
	err := (&Runtime{Path: missing}).Exec("kill", nil, nil)
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "exec "+missing+": ") {
		t.Errorf("Exec of a missing crun: %v", err)
	}
}

func TestState(t *testing.T) {
	r := fakeCrun(t, `[ "$*" = "--root=$ROOT state x" ] || { echo "wrong arguments: $*" >&2; exit 1; }
echo '{"id":"x","pid":42,"status":"running","bundle":"/b","rootfs":"/b/rootfs","created":"2025-01-01T00:00:00Z","annotations":{"a":"b"}}'`)
	t.Setenv("ROOT", r.Global.Root)

	_, err := r.State(context.Background(), "x")
	if want := `container "x": container not found under ` + r.Global.Root; !errors.Is(err, ErrNotFound) || err.Error() != want {
		t.Errorf("a container crun has no state of: %v, want %q", err, want)
	}

	if err := os.Mkdir(filepath.Join(r.Global.Root, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := r.State(context.Background(), "x")
	want := &State{ID: "x", Pid: 42, Status: StatusRunning, Bundle: "/b", Rootfs: "/b/rootfs",
		Created: "2025-01-01T00:00:00Z", Annotations: map[string]string{"a": "b"}}
	if err != nil || !reflect.DeepEqual(st, want) {
		t.Errorf("State = %+v, %v; want %+v", st, err, want)
	}
}

func TestStateFailures(t *testing.T) {
	for script, want := range map[string]string{
		"echo not json":              `decoding crun state of "x": `,
		"echo 'no such' >&2; exit 1": "crun state: no such",
	} {
		r := fakeCrun(t, script)
		if err := os.Mkdir(filepath.Join(r.Global.Root, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := r.State(context.Background(), "x"); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %v, want %q", script, err, want)
		}
	}
}

func TestReadStatus(t *testing.T) {
	r := &Runtime{Global: Global{Root: t.TempDir()}}
	if _, err := r.ReadStatus("x"); !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), `reading crun status of "x": `) {
		t.Errorf("no status file: %v", err)
	}
	file := filepath.Join(r.Global.Root, "x", "status")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(`{"pid":42,"cgroup-path":"/libpod_parent/libpod-x","rootfs":"/r","bundle":"/b",`+
		`"systemd-cgroup":true,"external_descriptors":"[\"/dev/null\"]","created":"later"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := r.ReadStatus("x")
	want := &Status{Pid: 42, CgroupPath: "/libpod_parent/libpod-x", Rootfs: "/r", Bundle: "/b", SystemdCgroup: true,
		ExternalDescriptors: `["/dev/null"]`}
	if err != nil || !reflect.DeepEqual(st, want) {
		t.Errorf("ReadStatus = %+v, %v; want %+v", st, err, want)
	}
	if err := os.WriteFile(file, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadStatus("x"); err == nil || !strings.HasPrefix(err.Error(), "decoding crun status "+file+": ") {
		t.Errorf("a bad status file: %v", err)
	}
}
