package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// cmdTimeout bounds every external command: the largest stock restore on
// this kind of machine takes well under a minute.
const cmdTimeout = 10 * time.Minute

// runCmd runs a command and returns its stdout and wall time. A failure
// carries the command line and the tail of its stderr.
func runCmd(ctx context.Context, name string, args ...string) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return stdout.String(), d, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, tail(stderr.String(), 1500))
	}
	return stdout.String(), d, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Tools are the programs the benchmark drives.
type Tools struct {
	Podman     string // the real podman, not tclone's wrapper
	PodmanFork string
	Tclone     string
	Criu       string
	Unshare    string
	Holder     string // static holder binary, mounted into containers
	Crictl     string // cri-tools' crictl, found when the CRI forks run
}

func (t Tools) podman(ctx context.Context, args ...string) (string, time.Duration, error) {
	return runCmd(ctx, t.Podman, args...)
}

// service is a private Podman API service for podman-fork, started with
// tclone as its runtime, so that no fork pays for starting one and the
// benchmark depends on no one else's service.
type service struct {
	dir string
	cmd *exec.Cmd
	url string
}

func startService(podman string) (*service, error) {
	dir, err := os.MkdirTemp("", "tcb-bench-svc-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "podman.sock")
	cmd := exec.Command(podman, "--runtime", "tclone", "system", "service", "--time=0", "unix://"+sock)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	logf, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting a Podman service: %w", err)
	}
	logf.Close()
	s := &service{dir: dir, cmd: cmd, url: "unix://" + sock}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("unix", sock, 500*time.Millisecond); err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("the Podman service did not answer on %s within 30s", sock)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the service this benchmark started, by its PID.
func (s *service) stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	os.RemoveAll(s.dir)
}

// findTool returns the first existing executable among paths, else looks
// name up in PATH.
func findTool(name string, paths ...string) (string, error) {
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found (looked in %s and PATH)", name, strings.Join(paths, ", "))
	}
	return p, nil
}

// benchModule is this harness's module, which holds the holder's source.
const benchModule = "github.com/tclone/tclone/test/bench"

// benchModuleDir finds this harness's module directory: the working
// directory or one above it, or test/bench below one of those (so that a
// harness started from the repository root finds it too).
func benchModuleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		for _, d := range []string{dir, filepath.Join(dir, "test", "bench")} {
			if declaresModule(filepath.Join(d, "go.mod"), benchModule) {
				return d, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the tclone checkout (no go.mod of %s at or above the working directory, nor in a test/bench there)", benchModule)
		}
		dir = parent
	}
}

// declaresModule reports whether the go.mod file at path declares module.
func declaresModule(path, module string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && f[1] == module {
			return true
		}
	}
	return false
}

// buildHolder builds the static holder into dir.
func buildHolder(ctx context.Context, dir string) (string, error) {
	src, err := benchModuleDir()
	if err != nil {
		return "", fmt.Errorf("building the holder: %w (or pass --holder)", err)
	}
	out := filepath.Join(dir, "holder")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./holder")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./holder in %s: %w: %s", src, err, b)
	}
	return out, nil
}
