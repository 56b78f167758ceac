package lazy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runHook runs the test binary as CRIU runs a copy-on-write restore's
// action script: no argument, the action and the tree's root in the
// environment, and the hook's configuration (ShareHook's env).
func runHook(t *testing.T, action string, p Paths) (stats string, err error) {
	t.Helper()
	script, env, stats, err := ShareHook(t.TempDir(), p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), env, "CRTOOLS_SCRIPT_ACTION="+action, "CRTOOLS_INIT_PID=4242")
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, out)
	}
	return stats, err
}

// The hook asks the plan's daemon to share with the restored tree's root at
// pre-resume only, and reports what it answered, or why it failed.
func TestShareHook(t *testing.T) {
	p := Paths{Control: filepath.Join(t.TempDir(), "control.sock")}
	ln, err := net.Listen("unix", p.Control)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	asked := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			asked <- strings.TrimSpace(line)
			fmt.Fprintln(c, `ok {"tasks":2,"areas":5,"refused":1,"bytes":8192,"reason":"busy"}`)
			c.Close()
		}
	}()

	stats, err := runHook(t, "post-restore", p)
	if err != nil {
		t.Fatalf("the hook at post-restore: %v", err)
	}
	if _, err := os.Stat(stats); !os.IsNotExist(err) || len(asked) != 0 {
		t.Fatalf("the hook acted at post-restore (stats: %v, requests: %d)", err, len(asked))
	}

	stats, err = runHook(t, "pre-resume", p)
	if err != nil {
		t.Fatalf("the hook at pre-resume: %v", err)
	}
	if got := <-asked; got != "share 4242" {
		t.Fatalf("the hook asked %q, want share 4242", got)
	}
	r, err := ReadShareResult(stats)
	if err != nil || r == nil || r.Error != "" || r.Tasks != 2 || r.Areas != 5 || r.Refused != 1 || r.Bytes != 8192 || r.Reason != "busy" {
		t.Fatalf("ReadShareResult = %+v, %v", r, err)
	}

	ln.Close()
	stats, err = runHook(t, "pre-resume", p)
	if err == nil {
		t.Fatal("the hook succeeded with no daemon to ask")
	}
	if r, _ := ReadShareResult(stats); r == nil || r.Error == "" {
		t.Fatalf("the hook's result without a daemon: %+v", r)
	}
	if r, err := ReadShareResult(filepath.Join(t.TempDir(), "none.json")); r != nil || err != nil {
		t.Fatalf("a hook that never ran: %+v, %v", r, err)
	}
}
