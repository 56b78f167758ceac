package lazy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/plan"
)

// Client is a restore's connection to its plan's daemon. While it is open
// the daemon stays.
type Client struct {
	conn net.Conn
	rd   *bufio.Reader
}

// startWait bounds how long a new daemon may take to answer.
const startWait = 10 * time.Second

// Ensure connects to the daemon of the plan whose images are planImages,
// starting it if none answers.
func Ensure(ctx context.Context, p Paths, planImages string) (*Client, error) {
	unlock, err := plan.Lock(ctx, p.Lock)
	if err != nil {
		return nil, fmt.Errorf("lazy pages: locking the plan's daemon: %w", err)
	}
	defer unlock()
	if c, err := dial(p.Control); err == nil {
		return c, nil
	}
	// None answers: a socket left is a dead daemon's.
	os.Remove(p.Control)
	cmd, err := spawn(p, daemonConfig{PlanImages: planImages}, nil)
	if err != nil {
		return nil, err
	}
	return waitAnswer(ctx, p, cmd)
}

// waitAnswer waits for a daemon just started to answer at its control
// socket, and kills it if it does not in time.
func waitAnswer(ctx context.Context, p Paths, cmd *exec.Cmd) (*Client, error) {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.NewTimer(startWait)
	defer deadline.Stop()
	for {
		if c, err := dial(p.Control); err == nil {
			return c, nil
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("lazy pages: the daemon exited at start (%v); see %s", err, p.Log)
		case <-deadline.C:
			cmd.Process.Kill()
			return nil, fmt.Errorf("lazy pages: the daemon did not answer within %s; see %s", startWait, p.Log)
		case <-ctx.Done():
			cmd.Process.Kill()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// spawn starts a daemon, detached from the caller's session and cgroup,
// with extra descriptors from 3 on.
func spawn(p Paths, cfg daemonConfig, extra []*os.File) (*exec.Cmd, error) {
	cfg.Paths, cfg.Idle = p, IdleExit
	cfg.ChunkPause, _ = time.ParseDuration(os.Getenv(EnvChunkPause))
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, DaemonCommand, string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.ExtraFiles = extra
	// Stdio is /dev/null: a descriptor of the caller's (conmon's pipes)
	// held by the daemon would keep its reader waiting.
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lazy pages: starting the daemon: %w", err)
	}
	if err := cgroups.Escape(cmd.Process.Pid); err != nil {
		logrus.Warnf("lazy-pages daemon stays in its caller's cgroup: %v", err)
	}
	return cmd, nil
}

func dial(path string) (*Client, error) {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, rd: bufio.NewReader(conn)}, nil
}

// Listen has the daemon accept a restore at socket, the lazy-pages.socket of
// the restore's work directory. A copy-on-write plan's daemon shares its
// snapshots' pages with the sibling when its restore's pre-resume hook asks
// (ShareHook).
func (c *Client) Listen(socket string) error { return c.listen("listen", socket) }

// ListenCopying is Listen for a sibling that gets copies of the pages.
func (c *Client) ListenCopying(socket string) error { return c.listen("listen-copy", socket) }

func (c *Client) listen(verb, socket string) error {
	if _, err := c.request(verb + " " + socket); err != nil {
		return fmt.Errorf("lazy pages: the daemon refused %s: %w", socket, err)
	}
	return nil
}

// request sends one request and returns the answer after "ok".
func (c *Client) request(req string) (string, error) {
	return c.requestBy(req, time.Now().Add(startWait))
}

// requestBy is request with the answer due by deadline.
func (c *Client) requestBy(req string, deadline time.Time) (string, error) {
	if strings.ContainsAny(req, "\n") {
		return "", errors.New("lazy pages: a request with a newline")
	}
	c.conn.SetDeadline(deadline)
	defer c.conn.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c.conn, "%s\n", req); err != nil {
		return "", fmt.Errorf("lazy pages: asking the daemon: %w", err)
	}
	line, err := c.rd.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("lazy pages: the daemon did not answer: %w", err)
	}
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "error "); ok {
		return "", errors.New(rest)
	}
	if line == "ok" {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		return rest, nil
	}
	return "", fmt.Errorf("lazy pages: the daemon answered %q", line)
}

// Close lets the daemon go: once no restore is connected and no sibling
// fills, it exits.
func (c *Client) Close() error { return c.conn.Close() }

// WaitDrained waits until a twin plan's daemon has drained its twins into
// page images, or ctx ends (by its deadline: drainWait without one).
func (c *Client) WaitDrained(ctx context.Context) error {
	_, err := c.WaitDrainedState(ctx)
	return err
}

// WaitDrainedState is WaitDrained, and says what the drain copied.
func (c *Client) WaitDrainedState(ctx context.Context) (lazypages.DrainState, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(drainWait)
	}
	type answer struct {
		s   string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		s, err := c.requestBy("wait-drained", deadline)
		done <- answer{s, err}
	}()
	var st lazypages.DrainState
	select {
	case a := <-done:
		if a.err != nil {
			return st, a.err
		}
		if err := json.Unmarshal([]byte(a.s), &st); err != nil {
			return st, fmt.Errorf("lazy pages: the daemon's drain state %q: %w", a.s, err)
		}
		return st, nil
	case <-ctx.Done():
		c.conn.Close()
		<-done
		return st, ctx.Err()
	}
}

// drainWait bounds WaitDrained without a deadline of its caller's.
const drainWait = 10 * time.Minute
