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
	cmd, err := spawn(p, planImages)
	if err != nil {
		return nil, err
	}
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

// spawn starts a daemon, detached from the caller's session and cgroup.
func spawn(p Paths, planImages string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pause, _ := time.ParseDuration(os.Getenv(EnvChunkPause))
	cfg, err := json.Marshal(daemonConfig{Paths: p, PlanImages: planImages, Idle: IdleExit, ChunkPause: pause})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, DaemonCommand, string(cfg))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
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
// the restore's work directory.
func (c *Client) Listen(socket string) error {
	if strings.ContainsAny(socket, "\n") {
		return errors.New("lazy pages: a socket path with a newline")
	}
	c.conn.SetDeadline(time.Now().Add(startWait))
	defer c.conn.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c.conn, "listen %s\n", socket); err != nil {
		return fmt.Errorf("lazy pages: asking the daemon to listen: %w", err)
	}
	line, err := c.rd.ReadString('\n')
	if err != nil {
		return fmt.Errorf("lazy pages: the daemon did not answer: %w", err)
	}
	if line = strings.TrimSpace(line); line != "ok" {
		return fmt.Errorf("lazy pages: the daemon refused %s: %s", socket, strings.TrimPrefix(line, "error "))
	}
	return nil
}

// Close lets the daemon go: once no restore is connected and no sibling
// fills, it exits.
func (c *Client) Close() error { return c.conn.Close() }
