package lazy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/internal/fds"
	"github.com/tclone/tclone/runtime/plan"
)

// daemonConfig is what the daemon is started with.
type daemonConfig struct {
	Paths
	// PlanImages is the plan's images directory, linked into Paths.Images.
	PlanImages string `json:"plan_images"`
	// Idle is IdleExit as the starter saw it.
	Idle time.Duration `json:"idle"`
	// ChunkPause slows the background fill (EnvChunkPause).
	ChunkPause time.Duration `json:"chunk_pause,omitempty"`
}

// RunDaemonIfAsked runs a plan's daemon and exits when argv asks for it.
func RunDaemonIfAsked() {
	if len(os.Args) < 3 || os.Args[1] != DaemonCommand {
		return
	}
	var cfg daemonConfig
	if err := json.Unmarshal([]byte(os.Args[2]), &cfg); err != nil {
		os.Exit(2)
	}
	fds.CloseInherited(2)
	if f, err := os.OpenFile(cfg.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		logrus.SetOutput(f)
	}
	if err := serve(cfg); err != nil {
		logrus.Errorf("lazy-pages daemon: %v", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// server is a running daemon.
type server struct {
	cfg    daemonConfig
	d      *lazypages.Daemon
	ln     *net.UnixListener
	mu     sync.Mutex
	conns  int // restores connected to the control socket
	fills  int // siblings connected and not yet complete or failed
	change time.Time
}

func serve(cfg daemonConfig) error {
	defer os.RemoveAll(cfg.Images)
	if err := linkImages(cfg.PlanImages, cfg.Images); err != nil {
		return err
	}
	s := &server{cfg: cfg, change: time.Now()}
	var err error
	s.d, err = lazypages.Start(lazypages.Options{ImagesDir: cfg.Images, OnEvent: s.event, ChunkPause: cfg.ChunkPause})
	if err != nil {
		return err
	}
	defer s.d.Close()
	if err := os.MkdirAll(filepath.Dir(cfg.Control), 0o700); err != nil {
		return err
	}
	s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Control, Net: "unix"})
	if err != nil {
		return err
	}
	s.ln.SetUnlinkOnClose(true)
	go s.accept()
	logrus.Infof("serving plan images %s at %s", cfg.PlanImages, cfg.Control)
	s.waitIdle()
	// Siblings still filling at this point are none: waitIdle returns
	// only when none is. Close kills any that raced in.
	return nil
}

// linkImages gives the daemon images of its own: hard links on the same
// tmpfs, which outlive the plan's directory.
func linkImages(from, to string) error {
	os.RemoveAll(to)
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("lazy pages: reading the plan's images: %w", err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := os.Link(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return fmt.Errorf("lazy pages: linking the plan's images: %w", err)
			}
		}
	}
	return nil
}

func (s *server) event(ev lazypages.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ev.Kind {
	case lazypages.EventConnected:
		s.fills++
	case lazypages.EventComplete, lazypages.EventFailed:
		s.fills--
		s.change = time.Now()
	}
	entry := logrus.WithFields(logrus.Fields{"sibling": ev.Sibling, "socket": ev.Socket, "event": ev.Kind})
	if ev.Stats != nil {
		entry = entry.WithField("stats", fmt.Sprintf("%+v", *ev.Stats))
	}
	if ev.Err != nil {
		entry.WithError(ev.Err).Warn("sibling failed")
		return
	}
	entry.Debug("sibling")
}

func (s *server) accept() {
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns++
		s.mu.Unlock()
		go s.handle(conn)
	}
}

// handle serves one restore's control connection: "listen PATH" requests,
// answered "ok" or "error REASON", until the restore closes it.
func (s *server) handle(conn *net.UnixConn) {
	defer func() {
		conn.Close()
		s.mu.Lock()
		s.conns--
		s.change = time.Now()
		s.mu.Unlock()
	}()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		path, ok := strings.CutPrefix(sc.Text(), "listen ")
		if !ok {
			fmt.Fprintf(conn, "error unknown request %q\n", sc.Text())
			continue
		}
		if err := s.d.Listen(path); err != nil {
			fmt.Fprintf(conn, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Fprintln(conn, "ok")
	}
}

// waitIdle returns once nothing has been connected or filling for
// IdleExit, holding the plan's lazy lock while it stops listening, so that
// a restore starting now either reached this daemon before or starts the
// next one.
func (s *server) waitIdle() {
	for {
		time.Sleep(min(time.Second, s.cfg.Idle/4))
		s.mu.Lock()
		idle := s.conns == 0 && s.fills == 0 && time.Since(s.change) >= s.cfg.Idle
		s.mu.Unlock()
		if !idle {
			continue
		}
		done, cancel := context.WithCancel(context.Background())
		cancel() // try the lock without waiting
		unlock, err := plan.Lock(done, s.cfg.Lock)
		if err != nil {
			continue // a restore is starting: stay
		}
		s.mu.Lock()
		idle = s.conns == 0 && s.fills == 0
		s.mu.Unlock()
		if idle {
			// The lock file goes too, removed while held: a restore
			// waiting for it notices and locks a new one (plan.Lock).
			s.ln.Close()
			os.Remove(s.cfg.Lock)
		}
		unlock()
		if idle {
			return
		}
	}
}
