package lazy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
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
	// Branches is the branch store of an incremental drain's base.
	Branches string `json:"branches,omitempty"`
	// Idle is IdleExit as the starter saw it.
	Idle time.Duration `json:"idle"`
	// ChunkPause slows the background fill (EnvChunkPause).
	ChunkPause time.Duration `json:"chunk_pause,omitempty"`
	// Cow is set for a copy-on-write plan's daemon (Hold).
	Cow *cowConfig `json:"cow,omitempty"`
}

// RunDaemonIfAsked runs a plan's daemon and exits when argv asks for it.
func RunDaemonIfAsked() {
	var cfg daemonConfig
	// A copy-on-write plan's daemon is passed its snapshots from 3 on.
	if !fds.HelperArgsKeeping(DaemonCommand, &cfg, func() int { return 2 + cfg.Cow.count() }) {
		return
	}
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
	// releasing counts twins being ended and reaped.
	releasing sync.WaitGroup
}

// twinReleaser is the drain's Release: it ends and reaps the twin of image
// pid, in the background (a filler calls it on its way out).
func (s *server) twinReleaser(twins []*heldTwin) func(int32) {
	byPid := map[int32]*heldTwin{}
	for _, t := range twins {
		byPid[t.imagePid] = t
	}
	return func(pid int32) {
		t := byPid[pid]
		if t == nil {
			return
		}
		s.releasing.Add(1)
		go func() {
			defer s.releasing.Done()
			start := time.Now()
			if err := t.release(); err != nil {
				logrus.Warnf("releasing twin %d of process %d: %v", t.Twin, t.Pid, err)
				return
			}
			logrus.WithFields(logrus.Fields{"twin": t.Twin, "process": t.Pid, "image_pid": pid, "release_ms": time.Since(start).Milliseconds()}).Info("twin drained and released")
		}()
	}
}

func serve(cfg daemonConfig) error {
	defer os.RemoveAll(cfg.Images)
	if err := linkImages(cfg.PlanImages, cfg.Images); err != nil {
		return err
	}
	s := &server{cfg: cfg, change: time.Now()}
	opts := lazypages.Options{ImagesDir: cfg.Images, OnEvent: s.event, ChunkPause: cfg.ChunkPause}
	var base *baseImages
	if cfg.Cow != nil {
		snaps, err := cfg.Cow.files()
		if err != nil {
			return err
		}
		// Released when the daemon exits: the plan is gone or expired.
		defer closeAll(snaps)
		twins, err := cfg.Cow.twins()
		if err != nil {
			return err
		}
		// Whatever draining has not released yet is ended and reaped
		// here, after the lazypages daemon is closed: no sibling reads
		// any twin then.
		defer func() {
			s.releasing.Wait()
			if err := releaseTwins(twins); err != nil {
				logrus.Warnf("releasing the twins: %v (tclone gc reaps what is left)", err)
				return
			}
			removeTwinsRecord(cfg.Paths)
		}()
		opts.Snapshots, opts.ShareWait = snaps, cfg.Cow.ShareWait
		if len(twins) > 0 {
			opts.Drain = &lazypages.Drain{PlanImages: cfg.PlanImages, Release: s.twinReleaser(twins)}
			var err error
			if base, err = incremental(opts.Drain, cfg); err != nil {
				return err
			}
			if base != nil {
				defer base.close()
			}
		}
	}
	var err error
	s.d, err = lazypages.Start(opts)
	if err != nil {
		return err
	}
	defer s.d.Close()
	if base != nil {
		// The base is read only while the twins are drained.
		go func() {
			s.d.WaitDrained()
			base.close()
		}()
	}
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
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		reply, err := s.request(verb, arg)
		if err != nil {
			fmt.Fprintf(conn, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Fprintln(conn, strings.TrimSpace("ok "+reply))
	}
}

// request answers one control request:
//
//	listen PATH       accept a restore at PATH (its pages shared, for a
//	                  copy-on-write plan's daemon; copied otherwise)
//	listen-copy PATH  accept a restore at PATH that gets copies only
//	share PID         share the snapshots' pages with the sibling whose
//	                  task PID is (its restore's pre-resume hook asks);
//	                  answers what was shared, as JSON
//	info              what the daemon holds, as JSON (Info)
func (s *server) request(verb, arg string) (string, error) {
	switch verb {
	case "listen":
		return "", s.d.Listen(arg)
	case "listen-copy":
		return "", s.d.ListenCopying(arg)
	case "share":
		pid, err := strconv.Atoi(arg)
		if err != nil || pid <= 0 {
			return "", fmt.Errorf("share: want a pid, got %q", arg)
		}
		if s.cfg.Cow == nil {
			return "", errors.New("share: this plan was not captured copy-on-write")
		}
		st, err := s.d.Share(pid)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(st)
		return string(b), err
	case "info":
		b, err := json.Marshal(s.info())
		return string(b), err
	case "wait-drained":
		// A copying restore of a twin plan waits here for page images.
		st, err := s.d.WaitDrained()
		if err != nil {
			return "", fmt.Errorf("the plan's twins could not be drained into page images: %w", err)
		}
		b, err := json.Marshal(st)
		return string(b), err
	}
	return "", fmt.Errorf("unknown request %q", verb)
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
		if c := s.cfg.Cow; c != nil {
			// Its snapshots are the plan's memory: kept until the plan
			// is gone or expired, then released at once.
			idle = s.conns == 0 && s.fills == 0 && c.planEnded()
		}
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
