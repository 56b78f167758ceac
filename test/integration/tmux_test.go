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

// fgGonePy gives the terminal's foreground to a child in a process group of
// its own, reaps the child, and sleeps on: the terminal's foreground group
// then has no process left, which is what a shell's terminal holds between
// reaping a job and taking the terminal back. It writes the terminal's
// foreground group, the child's PID, its own PID and its session to /tmp/fg
// once that is so.
const fgGonePy = `import os, time
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    time.sleep(0.3)
    os._exit(0)
try:
    os.setpgid(child, child)
except OSError:
    pass
os.tcsetpgrp(0, child)
os.waitpid(child, 0)
with open("/tmp/fg.tmp", "w") as f:
    f.write("%d %d %d %d" % (os.tcgetpgrp(0), child, os.getpid(), os.getsid(0)))
os.rename("/tmp/fg.tmp", "/tmp/fg")
while True:
    time.sleep(0.2)
    with open("/tmp/beat", "w") as f:
        f.write(str(time.time()))
`

// A fork in the instant a terminal's foreground process group is gone
// (a shell has reaped its job and not yet taken the terminal back) makes a
// sibling whose terminal is its session leader's, on the container's console
// and on a terminal of tmux's alike.
func TestForkWhileTerminalForegroundGroupIsGone(t *testing.T) {
	requireStack(t)
	for _, tc := range []struct {
		name string
		run  []string
	}{
		{"console", []string{"-t", workspace, "python3", "-c", fgGonePy}},
		{"tmux", []string{"-e", "FGPY=" + fgGonePy, workspace, "bash", "-c",
			`tmux new-session -d -s fg -x 80 -y 20 'python3 -c "$FGPY"' && while tmux has-session -t fg 2>/dev/null; do sleep 1; done`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := name(t, "fg"+tc.name)
			podman(t, append([]string{"run", "-d", "--name", src}, tc.run...)...)
			var fg, child, pid, sid int
			eventually(t, 20*time.Second, "the terminal's foreground group gone", func() error {
				out := podmanTry(t, "exec", src, "cat", "/tmp/fg")
				if _, err := fmt.Sscan(out.stdout, &fg, &child, &pid, &sid); err != nil {
					return fmt.Errorf("/tmp/fg: %q %s", out.stdout, out.stderr)
				}
				if fg != child {
					return fmt.Errorf("the foreground group is %d, not the reaped child's %d", fg, child)
				}
				return nil
			})
			r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
			if r.code != 0 {
				t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
			}
			// The source's terminal is left as it was; the sibling's is its
			// session leader's.
			if got := foregroundOf(t, src, pid); got != child {
				t.Errorf("the source's terminal's foreground group is %d, want %d as before the fork", got, child)
			}
			if got := foregroundOf(t, src+"-f", pid); got != sid {
				t.Errorf("the sibling's terminal's foreground group is %d, want the session leader's %d", got, sid)
			}
			for _, ctr := range []string{src, src + "-f"} {
				a := podman(t, "exec", ctr, "cat", "/tmp/beat")
				time.Sleep(1 * time.Second)
				if b := podman(t, "exec", ctr, "cat", "/tmp/beat"); b == a {
					t.Errorf("%s: the process on the terminal stopped", ctr)
				}
			}
		})
	}
}

// foregroundOf is the foreground process group of the controlling terminal
// of process pid in container ctr (tpgid, /proc/PID/stat's eighth field).
func foregroundOf(t *testing.T, ctr string, pid int) int {
	t.Helper()
	stat := podman(t, "exec", ctr, "cat", fmt.Sprintf("/proc/%d/stat", pid))
	// The fields after the command's name: state ppid pgrp session tty_nr tpgid.
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(f) < 6 {
		t.Fatalf("%s: /proc/%d/stat: %q", ctr, pid, stat)
	}
	var tpgid int
	if _, err := fmt.Sscan(f[5], &tpgid); err != nil {
		t.Fatalf("%s: /proc/%d/stat: %q", ctr, pid, stat)
	}
	return tpgid
}

// A job suspended in a shell (Ctrl-Z) is a stopped process, and a twin
// fork gives it a twin like every other. The twin is reaped from the
// stopped process once drained, which stays stopped: fork after fork
// works, the source keeps no twin, and the job goes on in the source and
// in the sibling when it is continued.
func TestForkTwiceWithASuspendedJob(t *testing.T) {
	requireStack(t)
	src := name(t, "suspended")
	podman(t, "run", "-d", "--name", src, "-e", "TERM=xterm", workspace, "bash", "-c",
		`tmux new-session -d -s job -x 80 -y 20 bash && tmux send-keys -t job "bash -c 'while :; do date +%s%N > /tmp/job; sleep 0.1; done'" Enter && `+
			`while tmux has-session -t job 2>/dev/null; do sleep 1; done`)
	// The states of the job's processes: those in a process group that
	// does not lead a session (the loop's bash, and its sleep). (Not
	// those on the pane's terminal: in a sibling, CRIU gives back the
	// controlling terminal to the session's leader only.)
	jobState := func(ctr string) string {
		return strings.TrimSpace(podmanTry(t, "exec", ctr, "bash", "-c",
			`ps -eo stat=,pgid=,sid= | awk '$2 != $3 { print substr($1, 1, 1) }' | sort -u | tr -d '\n'`).stdout)
	}
	eventually(t, 20*time.Second, "the job runs", func() error {
		if out := podmanTry(t, "exec", src, "cat", "/tmp/job"); out.code != 0 {
			return fmt.Errorf("%s", out.stderr)
		}
		return nil
	})
	podman(t, "exec", src, "tmux", "send-keys", "-t", "job", "C-z", "")
	eventually(t, 10*time.Second, "the job suspended", func() error {
		if s := jobState(src); !strings.Contains(s, "T") || strings.ContainsAny(s, "RS") {
			return fmt.Errorf("job processes in states %q", s)
		}
		return nil
	})
	stopped := podman(t, "exec", src, "cat", "/tmp/job")
	for i := 1; i <= 2; i++ {
		sib := fmt.Sprintf("%s-f%d", src, i)
		r := run(t, 3*time.Minute, podmanForkBin(), "--memory", "twin", "--wait-memory", "--name", sib, src)
		if r.code != 0 {
			t.Fatalf("fork %d: exit %d: %s", i, r.code, r.stderr)
		}
		eventually(t, 30*time.Second, "the twins released", func() error {
			if tw := podmanTwins(t, src); len(tw) > 0 {
				return fmt.Errorf("twins left in the source after fork %d: %v", i, tw)
			}
			return nil
		})
		for _, ctr := range []string{src, sib} {
			if s := jobState(ctr); !strings.Contains(s, "T") || strings.ContainsAny(s, "RS") {
				t.Errorf("%s: the suspended job is in states %q after fork %d, want stopped", ctr, s, i)
			}
			if got := podman(t, "exec", ctr, "cat", "/tmp/job"); got != stopped {
				t.Errorf("%s: the suspended job ran after fork %d", ctr, i)
			}
		}
	}
	// fg, in the source and in a sibling: the loop goes on.
	for _, ctr := range []string{src, src + "-f2"} {
		podman(t, "exec", ctr, "tmux", "send-keys", "-t", "job", "fg", "Enter")
		eventually(t, 10*time.Second, ctr+": the job continued", func() error {
			if got := podman(t, "exec", ctr, "cat", "/tmp/job"); got == stopped {
				return fmt.Errorf("not yet")
			}
			return nil
		})
	}
}
