package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A live tmux session with two panes survives a fork: in the sibling the
// session, both panes and their shells work, on their own terminals.
func TestForkKeepsTmuxSessionAlive(t *testing.T) {
	requireStack(t)
	src := name(t, "tmux")
	// tmux's server is the container's main process, like a workspace
	// whose session outlives any one attach.
	podman(t, "run", "-d", "--name", src, "-e", "TERM=xterm", workspace, "bash", "-c",
		`tmux new-session -d -s work -x 120 -y 40 'cd /tmp; bash' && tmux split-window -t work 'cd /root; bash' && `+
			`tmux send-keys -t work:0.0 'export PANE=left; while :; do date +%s > /tmp/left; sleep 0.2; done' Enter && `+
			`while tmux has-session -t work 2>/dev/null; do sleep 1; done`)
	tmux := func(ctr string, args ...string) result {
		return podmanTry(t, append([]string{"exec", ctr, "tmux"}, args...)...)
	}
	eventually(t, 20*time.Second, "tmux panes", func() error {
		if out := tmux(src, "list-panes", "-t", "work"); strings.Count(out.stdout, "\n") != 2 {
			return fmt.Errorf("panes: %q %s", out.stdout, out.stderr)
		}
		return nil
	})
	r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	sib := src + "-f"
	if out := tmux(sib, "list-panes", "-t", "work", "-F", "#{pane_id} #{pane_tty} #{pane_current_command}"); strings.Count(out.stdout, "\n") != 2 {
		t.Fatalf("sibling panes: %q %s", out.stdout, out.stderr)
	}
	// The right pane's shell answers keystrokes in the sibling and not in
	// the source: each has its own terminal.
	if out := tmux(sib, "send-keys", "-t", "work:0.1", "echo forked-$((6*7)) > /tmp/typed", "Enter"); out.code != 0 {
		t.Fatalf("send-keys: %s", out.stderr)
	}
	eventually(t, 10*time.Second, "typed command ran in the sibling", func() error {
		if out := podmanTry(t, "exec", sib, "cat", "/tmp/typed"); strings.TrimSpace(out.stdout) != "forked-42" {
			return fmt.Errorf("%q %s", out.stdout, out.stderr)
		}
		return nil
	})
	if out := podmanTry(t, "exec", src, "cat", "/tmp/typed"); out.code == 0 {
		t.Fatalf("the sibling's keystrokes reached the source: %q", out.stdout)
	}
	eventually(t, 10*time.Second, "capture-pane shows the command", func() error {
		if out := tmux(sib, "capture-pane", "-p", "-t", "work:0.1"); !strings.Contains(out.stdout, "forked-$((6*7))") {
			return fmt.Errorf("pane shows %q", out.stdout)
		}
		return nil
	})
	// The left pane's loop goes on in both.
	for _, ctr := range []string{src, sib} {
		a := podman(t, "exec", ctr, "cat", "/tmp/left")
		time.Sleep(1500 * time.Millisecond)
		if b := podman(t, "exec", ctr, "cat", "/tmp/left"); b == a {
			t.Errorf("%s: the left pane's loop stopped", ctr)
		}
	}
	// The pane shell keeps its environment.
	// The loop is stopped first; keys typed before its shell prompts again
	// may be lost, so the command is typed again until it has run.
	tmux(sib, "send-keys", "-t", "work:0.0", "C-c", "")
	eventually(t, 20*time.Second, "pane environment", func() error {
		if out := podmanTry(t, "exec", sib, "cat", "/tmp/pane-env"); strings.TrimSpace(out.stdout) != "left" {
			tmux(sib, "send-keys", "-t", "work:0.0", "echo $PANE > /tmp/pane-env", "Enter")
			return fmt.Errorf("%q", out.stdout)
		}
		return nil
	})
}
