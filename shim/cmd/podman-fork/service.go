package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containers/common/pkg/config"
	"github.com/containers/podman/v5/pkg/bindings"

	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// DefaultSocket is where a system Podman service listens.
const DefaultSocket = "/run/podman/podman.sock"

// target is the API service a fork goes through: a URL, and the ssh key
// for an ssh:// one. The zero target is the local Podman service.
type target struct {
	url, identity string
}

// destination reads --url, --connection and --ssh-identity.
func destination(url, connection, identity string) (target, error) {
	switch {
	case url != "" && connection != "":
		return target{}, fmt.Errorf("--url %s and --connection %s both say where to connect: give one", url, connection)
	case connection != "":
		cfg, err := config.Default()
		if err != nil {
			return target{}, fmt.Errorf("--connection %s: reading Podman's configuration: %w", connection, err)
		}
		dest, err := cfg.GetConnection(connection, false)
		if err != nil {
			return target{}, fmt.Errorf("--connection %s: %w (see podman system connection ls)", connection, err)
		}
		if identity == "" {
			identity = dest.Identity
		}
		return target{url: dest.URI, identity: identity}, nil
	case identity != "" && !strings.HasPrefix(url, "ssh://"):
		return target{}, fmt.Errorf("--ssh-identity is for an ssh:// --url or --connection; give one")
	}
	return target{url: url, identity: identity}, nil
}

// connect returns a context holding a connection to the target's service.
// With no URL it uses the local system Podman service, and when none
// answers it starts a private one for the duration of the command, so
// `podman container fork` works like any podman command without a running
// service. private asks for the private service whatever runs.
func connect(ctx context.Context, layout plan.Layout, t target, private bool) (context.Context, func(), error) {
	if t.url != "" {
		conn, err := bindings.NewConnectionWithIdentity(ctx, t.url, t.identity, false)
		if err != nil && strings.HasPrefix(t.url, "ssh://") && strings.Contains(err.Error(), "open failed") {
			return nil, nil, fmt.Errorf("connecting to the API service at %s: %w: the ssh server could not open the socket for "+
				"this user; check the path, and that the user may use it (tclone's socket: a member of the group tclone)", t.url, err)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("connecting to the API service at %s: %w", t.url, err)
		}
		return conn, func() {}, nil
	}
	if !private && answers(DefaultSocket) {
		conn, err := bindings.NewConnection(ctx, "unix://"+DefaultSocket)
		if err == nil {
			return conn, func() {}, nil
		}
	}
	return privateService(ctx, layout)
}

func answers(socket string) bool {
	c, err := net.DialTimeout("unix", socket, 500*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func privateService(ctx context.Context, layout plan.Layout) (context.Context, func(), error) {
	podman, err := realPodman(layout)
	if err != nil {
		return nil, nil, err
	}
	// The directory names its owner, so that if this process is killed a
	// later fork or tclone gc can tell it was left behind.
	dir, err := calls.MkdirTemp(plan.Store{Layout: layout}, "podman-fork-")
	if err != nil {
		return nil, nil, err
	}
	socket := filepath.Join(dir, "podman.sock")
	logPath := filepath.Join(dir, "service.log")
	// Podman unpacks and packs checkpoint archives in temporary
	// directories (TMPDIR, else /var/tmp): kept in this directory, they go
	// with it, also when this process and the service are killed mid-way.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	svc, err := startService(podman, socket, logPath, tmp)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	stop := func() {
		svc.stop()
		os.RemoveAll(dir)
	}
	if err := calls.RecordService(dir, svc.owner()); err != nil {
		stop()
		return nil, nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for !answers(socket) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			log, _ := os.ReadFile(logPath)
			stop()
			return nil, nil, fmt.Errorf("the Podman service started for this fork did not answer at %s within 15s: %s", socket, strings.TrimSpace(string(log)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := bindings.NewConnection(ctx, "unix://"+socket)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("connecting to Podman: %w", err)
	}
	return conn, stop, nil
}

// service is a private Podman service process.
type service struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startService starts `podman system service` for this command alone. It
// dies with this process: the kernel sends it SIGTERM when the thread that
// started it exits, and that thread stays locked to the goroutine that waits
// for the service, so it exits only with the process.
func startService(podman, socket, logPath, tmpDir string) (*service, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	// A service restores imported checkpoints with its default runtime;
	// this one must restore siblings with tclone whatever the host's
	// default is.
	cmd := exec.Command(podman, "--runtime", "tclone", "system", "service", "--time=0", "unix://"+socket)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1", "TMPDIR="+tmpDir)
	// Not the caller's working directory, which conmon would inherit and
	// fail on should it be removed meanwhile.
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so a ^C aimed at us reaches it only through
	// our cleanup, after the fork has been rolled back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	s := &service{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(s.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting a Podman service: %w", err)
	}
	return s, nil
}

func (s *service) owner() journal.Owner {
	o, _ := journal.OwnerOf(s.cmd.Process.Pid)
	return o
}

// stop ends the service. Only the service: a runtime it runs (tclone
// checkpoint, say) is in its process group and finishes on its own.
func (s *service) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// realPodman finds the podman binary itself, not the tclone wrapper that
// forwards `podman container fork` here.
func realPodman(layout plan.Layout) (string, error) {
	if st, err := os.Stat(layout.Podman); err == nil && !st.IsDir() {
		return layout.Podman, nil
	}
	return "", fmt.Errorf("podman not found at %s; install Podman 5 (hack/setup-host.sh does)", layout.Podman)
}
