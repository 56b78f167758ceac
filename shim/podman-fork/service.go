package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
)

// DefaultSocket is where a system Podman service listens.
const DefaultSocket = "/run/podman/podman.sock"

// connect returns a context holding a Podman connection. With no URL it
// uses the local system service, and when none answers it starts a private
// one for the duration of the command, so `podman container fork` works
// like any podman command without a running service.
func connect(ctx context.Context, url string) (context.Context, func(), error) {
	if url != "" {
		conn, err := bindings.NewConnection(ctx, url)
		if err != nil {
			return nil, nil, fmt.Errorf("connecting to Podman at %s: %w", url, err)
		}
		return conn, func() {}, nil
	}
	if answers(DefaultSocket) {
		conn, err := bindings.NewConnection(ctx, "unix://"+DefaultSocket)
		if err == nil {
			return conn, func() {}, nil
		}
	}
	return privateService(ctx)
}

func answers(socket string) bool {
	c, err := net.DialTimeout("unix", socket, 500*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func privateService(ctx context.Context) (context.Context, func(), error) {
	podman, err := realPodman()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "podman-fork-")
	if err != nil {
		return nil, nil, err
	}
	socket := filepath.Join(dir, "podman.sock")
	// A service restores imported checkpoints with its default runtime;
	// this one must restore siblings with tclone whatever the host's
	// default is.
	cmd := exec.Command(podman, "--runtime", "tclone", "system", "service", "--time=0", "unix://"+socket)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	cmd.Stderr = nil
	// Its own process group, so a ^C aimed at us reaches it only through
	// our cleanup, after the fork has been rolled back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("starting a Podman service: %w", err)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !answers(socket) {
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("the Podman service did not come up at %s within 15s", socket)
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

// realPodman finds the podman binary itself, not the tclone wrapper that
// forwards `podman container fork` here.
func realPodman() (string, error) {
	for _, p := range []string{"/usr/bin/podman", "/usr/local/bin/podman.real"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("podman")
	if err != nil || strings.Contains(p, "tclone") {
		return "", fmt.Errorf("podman not found; install Podman 5 (hack/setup-host.sh does)")
	}
	return p, nil
}
