package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/buildinfo"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/apiservice"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
	"github.com/tclone/tclone/shim/hostagent"
)

// newApp is `tclone service`, which tclone's verb of that name runs, on
// the host's layout.
func newApp(layout plan.Layout) *cli.App {
	return &cli.App{
		Metadata:  hostlayout.Metadata(layout),
		Name:      "tclone service",
		Usage:     "serve Podman's API with the fork and branch endpoints added, for REST clients local or remote",
		Version:   buildinfo.Version,
		ArgsUsage: " ",
		Description: `Listens on --url (or on the socket systemd passes, with tclone.socket) and
hands every request to Podman's API service at --podman-url unchanged
(streams, attach and exec included), except these, which it serves itself
(each under /{version} or without it):

  POST   /libpod/containers/{name}/fork?count=N&label=K=V&...   fork
  POST   /libpod/containers/{name}/branches?name=B&label=K=V    branch create
  GET    /libpod/branches[?source=S]                            branch ls
  GET    /libpod/branches/{branch}/json                         branch inspect
  GET    /libpod/branches/{branch}/diff?with=OTHER              branch diff
  POST   /libpod/branches/{branch}/start?count=N&...            branch start
  DELETE /libpod/branches/{branch}                              branch rm
  POST   /libpod/branches/prune?keep-last=N&older-than=D&yes=true  branch prune
  GET    /libpod/branches/{branch}/export                       branch export (the signed archive)
  POST   /libpod/branches/import?name=N&trust=KEY&insecure-unsigned=true
                                                                branch import (the archive as body)

Their query parameters are the commands' flags (readyTimeout or
ready-timeout). They answer JSON (the fork's stats, the branch), or Podman's
error body with 400 (bad parameter, or an import refused), 404 (no such
container or branch), 409 (paused, stopped, name or port taken, image
missing), 503 (Podman's service not running) or 500.

Clients reach it as they reach Podman: unix:///run/tclone/tclone.sock, or
ssh://USER@HOST/run/tclone/tclone.sock for a user allowed on the socket
(--group). On TERM it takes no new fork and lets the forks under way finish
(or, past --shutdown-grace, cancels them: they roll back), then exits.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Value: "unix://" + layout.ServiceSocket(), Usage: "where to listen: unix:///PATH or tcp://HOST:PORT (tcp has no authentication: bind it to loopback)"},
			&cli.StringFlag{Name: "podman-url", Value: "unix:///run/podman/podman.sock", Usage: "Podman's API service (a unix socket); it must restore with tclone"},
			&cli.StringFlag{Name: "group", Usage: "group allowed on the unix socket besides root (mode 0660)"},
			&cli.DurationFlag{Name: "shutdown-grace", Value: 2 * time.Minute, Usage: "on TERM, how long forks under way may take before they are cancelled and rolled back"},
			&cli.BoolFlag{Name: "debug", Usage: "debug output"},
		},
		Before: func(c *cli.Context) error {
			if c.Bool("debug") {
				logrus.SetLevel(logrus.DebugLevel)
			}
			return nil
		},
		Action:         runService,
		ExitErrHandler: func(*cli.Context, error) {},
	}
}

func runService(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("tclone service takes no arguments (got %q); give where to listen with --url", c.Args().First())
	}
	podman, err := unixPath(c.String("podman-url"))
	if err != nil {
		return fmt.Errorf("--podman-url: %w", err)
	}
	if c.Duration("shutdown-grace") <= 0 {
		return fmt.Errorf("--shutdown-grace %s: give how long forks under way may take at shutdown, such as 2m", c.Duration("shutdown-grace"))
	}
	ln, where, err := serviceListener(c.String("url"), c.String("group"))
	if err != nil {
		return err
	}
	svc := apiservice.New(hostagent.New(hostlayout.Of(c)), podman, buildinfo.Version)
	srv := &http.Server{Handler: svc, ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logrus.Infof("tclone %s serving Podman's API (from %s) with the fork endpoint at %s", buildinfo.Version, podman, where)
	select {
	case err := <-served:
		return fmt.Errorf("serving at %s: %w", where, err)
	case <-ctx.Done():
	}
	logrus.Infof("stopping: no new requests; waiting for forks under way (up to %s)", c.Duration("shutdown-grace"))
	// No new connection from now on; requests other than forks (event
	// streams, attach) are cut once the forks end.
	ln.Close()
	grace, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-grace"))
	defer cancel()
	svc.Shutdown(grace)
	// Answers written are let go for a moment; then the streams still open
	// (events, attach) are cut. Closing the listener removed a socket file
	// it made.
	idle, cancelIdle := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelIdle()
	srv.Shutdown(idle)
	srv.Close()
	logrus.Infof("stopped")
	return nil
}

// serviceListener listens where the URL says, or takes the socket systemd
// passes (socket activation).
func serviceListener(rawURL, group string) (net.Listener, string, error) {
	if activated() {
		ln, err := net.FileListener(os.NewFile(3, "LISTEN_FD_3"))
		if err != nil {
			return nil, "", fmt.Errorf("the socket systemd passed: %w", err)
		}
		return ln, "the socket systemd passed (" + ln.Addr().String() + ")", nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("--url %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "tcp":
		ln, err := net.Listen("tcp", u.Host)
		if err != nil {
			return nil, "", fmt.Errorf("--url %s: %w", rawURL, err)
		}
		logrus.Warnf("listening on tcp://%s: anyone who reaches it can fork and run containers as root", ln.Addr())
		return ln, "tcp://" + ln.Addr().String(), nil
	case "unix":
		ln, err := listenUnix(u.Path, group)
		return ln, rawURL, err
	}
	return nil, "", fmt.Errorf("--url %q: give unix:///PATH or tcp://HOST:PORT", rawURL)
}

// activated tells whether systemd passed this process its socket.
func activated() bool {
	pid, _ := strconv.Atoi(os.Getenv("LISTEN_PID"))
	n, _ := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	return pid == os.Getpid() && n >= 1
}

// listenUnix listens on path. A socket file left by a service that died is
// replaced; one a live service answers on is not.
func listenUnix(path, group string) (net.Listener, error) {
	if path == "" || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("--url unix://%s: give an absolute path, as unix:///run/tclone/tclone.sock", path)
	}
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			return nil, fmt.Errorf("--group %s: %w (create it with groupadd, or leave --group out)", group, err)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := letGroupThrough(filepath.Dir(path), gid, group); err != nil {
			return nil, err
		}
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("a service already listens at %s: stop it first, or give another --url", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	// The socket is made with no access, and opened up to its group only
	// once it has that group.
	old := syscall.Umask(0o777)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening at %s: %w", path, err)
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		if err := os.Chown(path, 0, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("giving %s to group %s: %w", path, group, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// letGroupThrough lets the group reach a socket in dir. tclone's own state
// directory (/run/tclone, made 0700 by the first fork) is opened to the
// group for traversal only: its contents stay root's (each is 0700).
func letGroupThrough(dir string, gid int, group string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	if st.Mode&0o001 != 0 || (int(st.Gid) == gid && st.Mode&0o010 != 0) {
		return nil
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		return fmt.Errorf("letting group %s reach %s: %w", group, dir, err)
	}
	mode := os.FileMode(st.Mode&0o7777) | 0o010
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("letting group %s reach %s: %w", group, dir, err)
	}
	logrus.Infof("%s is now group %s, mode %04o, so that the group reaches the socket", dir, group, mode)
	return nil
}

// unixPath reads a unix:///PATH URL.
func unixPath(raw string) (string, error) {
	path, ok := strings.CutPrefix(raw, "unix://")
	if !ok || !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q: give unix:///PATH to a socket", raw)
	}
	return path, nil
}
