package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/plan"
)

// The test binary stands in for the branch writer that `branch create
// --wait runnable` starts (this binary, run as podman-branch), as
// TCLONE_TEST_WRITER says.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == BranchCommand {
		notify := os.NewFile(3, "notify")
		switch os.Getenv("TCLONE_TEST_WRITER") {
		case "echo": // runnable, with its arguments as the branch's ID
			fmt.Fprintf(notify, "runnable %s\n", strings.Join(os.Args[1:], " "))
		case "real": // the real writer, failing to reach Podman
			connectTo = func(context.Context, plan.Layout, target, bool) (context.Context, func(), error) {
				return nil, nil, errors.New("no Podman\nin this test")
			}
			newBranchApp(plan.HostLayout()).Run(os.Args)
		case "exit":
			os.Exit(3)
		case "block": // until killed
			wait := make(chan os.Signal, 1)
			signal.Notify(wait, syscall.SIGUSR1)
			<-wait
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// stdout returns what f printed on standard output.
func stdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	t.Cleanup(func() { os.Stdout = saved })
	os.Stdout = w
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		out <- string(b)
	}()
	f()
	os.Stdout = saved
	w.Close()
	return <-out
}

// runBranch runs `podman container branch args...` with no Podman to reach,
// and branches and keys kept in the test's own directories.
func runBranch(t *testing.T, ctx context.Context, args ...string) error {
	t.Helper()
	t.Setenv("TCLONE_BRANCH_DIR", t.TempDir())
	t.Setenv("TCLONE_SIGNING_DIR", t.TempDir())
	connectTo = func(context.Context, plan.Layout, target, bool) (context.Context, func(), error) {
		return nil, nil, errReached
	}
	t.Cleanup(func() { connectTo = connect })
	// The layout the environment above moves, as a writer started in
	// the background (TestMain) reads it.
	app := newBranchApp(plan.HostLayout())
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	return app.RunContext(ctx, append([]string{BranchCommand}, args...))
}

// Every wrong call is refused, saying why, before Podman is reached or a
// branch is touched.
func TestBranchRefusedBeforePodman(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "tcp://h:8080", "ls"}, "podman container branch runs on the Podman host"},
		{[]string{"--connection", "c", "ls"}, "podman container branch runs on the Podman host"},
		{[]string{"--ssh-identity", "/k", "ls"}, "podman container branch runs on the Podman host"},
		{[]string{"create", "src"}, "takes SOURCE and NAME"},
		{[]string{"create", "src", "a b"}, `invalid branch name "a b"`},
		{[]string{"create", "--wait", "soon", "src", "b"}, "--wait soon: give runnable"},
		{[]string{"create", "--wait", "runnable", "--print-stats", "src", "b"}, "--print-stats needs --wait durable"},
		{[]string{"create", "--label", "io.tclone.fork-call=x", "src", "b"}, "are set by the fork itself"},
		{[]string{"create", "--volume-mode", "move", "src", "b"}, "--volume-mode: volume mode \"move\""},
		{[]string{"create", "--colour", "src", "b"}, "flag provided but not defined: -colour; see --help"},
		{[]string{"ls", "a", "b"}, "takes at most one SOURCE"},
		{[]string{"ls", "--format", "yaml"}, `unknown --format "yaml" (use json)`},
		{[]string{"inspect"}, "takes one or more branch names"},
		{[]string{"start"}, "takes exactly one branch NAME"},
		{[]string{"start", "--tcp-close", "b"}, "--tcp-close says how the source is captured"},
		{[]string{"start", "--volume-mode", "share", "b"}, "--volume-mode says how the source is captured"},
		{[]string{"start", "--count", "0", "b"}, "--count 0: out of range"},
		{[]string{"start", "--format", "yaml", "b"}, "unknown --format"},
		{[]string{"start", "--count", "2", "-p", "8080:80", "b"}, "host port"},
		{[]string{"rm"}, "takes one or more branch names"},
		{[]string{"prune", "x"}, "takes no arguments"},
		{[]string{"prune"}, "say what to prune"},
		{[]string{"prune", "--format", "yaml", "--keep-last", "1"}, "unknown --format"},
		{[]string{"diff", "a"}, "takes two branches, A and B"},
		{[]string{"diff", "--format", "yaml", "a", "b"}, "unknown --format"},
		{[]string{"export", "a"}, "takes a branch NAME and a FILE"},
		{[]string{"import"}, "takes one FILE"},
		{[]string{"import", "--trust", "no-such-key", "f"}, "--trust no-such-key: neither a public key nor a readable file"},
		{[]string{"key", "x"}, "takes no arguments"},
	} {
		err := runBranch(t, context.Background(), c.args...)
		if err == nil || errors.Is(err, errReached) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	for _, args := range [][]string{
		{"create", "src", "b"},
		{"--url", "unix:///run/p.sock", "start", "--count", "2", "b"},
		{"import", "f"},
	} {
		if err := runBranch(t, context.Background(), args...); !errors.Is(err, errReached) {
			t.Errorf("%v: %v, want the call to reach Podman", args, err)
		}
	}
}

// A create that returns once runnable hands every branch flag it was given
// to a writer of its own, and prints the ID the writer reports.
func TestCreateInBackgroundPassesItsFlags(t *testing.T) {
	t.Setenv("TCLONE_TEST_WRITER", "echo")
	var err error
	out := stdout(t, func() {
		err = runBranch(t, context.Background(), "--url=unix:///run/p.sock", "create", "--wait", "runnable",
			"--label", "a=b,c", "--label", "k=v", "--volume-mode", "db=share", "--file-locks", "src", "br")
	})
	want := "--url=unix:///run/p.sock create --wait=durable --notify-fd=3 --label=a=b,c --label=k=v --volume-mode=db=share --file-locks=true -- src br\n"
	if err != nil || out != want {
		t.Errorf("the writer got %q, %v; want %q", out, err, want)
	}
}

// The writer's failure before the branch is runnable is the command's,
// on one line.
func TestCreateInBackgroundWriterFails(t *testing.T) {
	t.Setenv("TCLONE_TEST_WRITER", "real")
	err := runBranch(t, context.Background(), "create", "--wait", "runnable", "src", "br")
	if err == nil || err.Error() != "no Podman in this test" {
		t.Errorf("%v, want the writer's error", err)
	}
	t.Setenv("TCLONE_TEST_WRITER", "exit")
	err = runBranch(t, context.Background(), "create", "--wait", "runnable", "src", "br")
	if want := "the branch writer ended (exit status 3) before the branch was runnable; run tclone gc"; err == nil || err.Error() != want {
		t.Errorf("writer that said nothing: %v, want %q", err, want)
	}
}

// A cancelled create ends its writer, which rolls back.
func TestCreateInBackgroundCancelled(t *testing.T) {
	t.Setenv("TCLONE_TEST_WRITER", "block")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := runBranch(t, ctx, "create", "--wait", "runnable", "src", "br")
	if want := "branch br cancelled; everything it made was removed"; err == nil || err.Error() != want {
		t.Errorf("%v, want %q", err, want)
	}
}

// The writer tells the command once: runnable with the branch's ID, or
// why it failed; and says when the command is no longer there to hear it.
func TestNotice(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	n := &notice{f: w}
	if err := n.runnable(&branch.Branch{ID: "0123456789abcdef", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	n.failed(errors.New("too late"))
	if err := n.runnable(&branch.Branch{ID: "again"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(r); string(got) != "runnable 0123456789abcdef\n" {
		t.Errorf("the command read %q", got)
	}
	r.Close()

	r, w, err = os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	err = (&notice{f: w}).runnable(&branch.Branch{ID: "0123456789abcdef", Name: "b"})
	if err == nil || !strings.HasPrefix(err.Error(), "the command that asked for branch b is gone") {
		t.Errorf("runnable with the command gone: %v", err)
	}
	// Without --notify-fd there is no one to tell.
	var none notice
	none.failed(errors.New("x"))
	if err := none.runnable(&branch.Branch{}); err != nil {
		t.Errorf("runnable without a command waiting: %v", err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		1 << 20: "1.0 MiB", 5 << 30: "5.0 GiB", 3 << 40: "3072.0 GiB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
