package hostagent

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// fakeConmon runs this test binary as a process whose arguments look like
// an exec session's conmon; with a child, it is a pair like the real one.
func fakeConmon(t *testing.T, session string, pair bool) *exec.Cmd {
	t.Helper()
	cmd := &exec.Cmd{
		Path: os.Args[0],
		Args: []string{"/fake/conmon", "-test.run=TestHelperConmon", "--", "-u", session, "--exec-attach"},
		Env:  append(os.Environ(), "TCLONE_FAKE_CONMON=1"),
	}
	if pair {
		cmd.Env = append(cmd.Env, "TCLONE_FAKE_CONMON_PAIR=1")
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestHelperConmon(t *testing.T) {
	if os.Getenv("TCLONE_FAKE_CONMON") != "1" {
		return // a helper process for TestReapExecConmon, not a test of its own
	}
	if os.Getenv("TCLONE_FAKE_CONMON_PAIR") == "1" {
		self, _ := os.Executable()
		child := &exec.Cmd{Path: self, Args: os.Args, Env: []string{"TCLONE_FAKE_CONMON=1"}}
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		child.Wait()
		os.Exit(0)
	}
	time.Sleep(time.Hour)
}

func TestReapExecConmon(t *testing.T) {
	fakeConmon(t, "s1", true)
	other := fakeConmon(t, "s2", false)
	deadline := time.Now().Add(10 * time.Second)
	for len(execConmonPids("s1")) < 2 || len(execConmonPids("s2")) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("fake conmons did not start: %v %v", execConmonPids("s1"), execConmonPids("s2"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	reapExecConmon("s1")
	if left := execConmonPids("s1"); len(left) != 0 {
		t.Fatalf("the session's conmons survived: %v", left)
	}
	if got := execConmonPids("s2"); len(got) != 1 || got[other.Process.Pid] == 0 {
		t.Fatalf("another session's conmon was touched: %v", got)
	}
}
