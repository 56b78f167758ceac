// Package crun locates crun and runs it on tclone's behalf. tclone delegates
// every ordinary OCI verb to crun unchanged and reads crun's container state
// when it needs to act on a container itself (checkpoint, fork).
package crun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// EnvBinary names an environment variable that overrides which crun binary is
// used (for tests and for hosts with crun outside PATH).
const EnvBinary = "TCLONE_CRUN"

// DefaultRoot is where crun keeps container state when no --root is given.
const DefaultRoot = "/run/crun"

// Global holds the runtime-wide flags crun understands. Every call tclone makes
// to crun carries them, so that crun sees the same state root, log and cgroup
// manager that the caller (Podman, conmon) asked tclone for.
type Global struct {
	Root          string
	Log           string
	LogFormat     string
	LogLevel      string
	Debug         bool
	SystemdCgroup bool
	CgroupManager string
	Rootless      string
}

// Args renders the global flags in crun's spelling.
func (g Global) Args() []string {
	var a Args
	a.Flag("--debug", g.Debug)
	a.Assign("--log", g.Log)
	a.Assign("--log-format", g.LogFormat)
	a.Assign("--log-level", g.LogLevel)
	a.Assign("--root", g.Root)
	a.Flag("--systemd-cgroup", g.SystemdCgroup)
	a.Assign("--cgroup-manager", g.CgroupManager)
	a.Assign("--rootless", g.Rootless)
	return a
}

// StateRoot is the directory crun keeps its per-container state in.
func (g Global) StateRoot() string {
	if g.Root != "" {
		return g.Root
	}
	return DefaultRoot
}

// Runtime is a located crun binary plus the global flags to call it with.
type Runtime struct {
	Path   string
	Global Global
}

// Find locates crun: $TCLONE_CRUN if set, else crun in PATH, else the usual
// install locations (conmon and Podman sometimes run us with a minimal PATH).
func Find(g Global) (*Runtime, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if err := isExecutable(p); err != nil {
			return nil, fmt.Errorf("crun from $%s: %w", EnvBinary, err)
		}
		return &Runtime{Path: p, Global: g}, nil
	}
	if p, err := exec.LookPath("crun"); err == nil {
		return &Runtime{Path: p, Global: g}, nil
	}
	for _, p := range []string{"/usr/bin/crun", "/usr/local/bin/crun", "/usr/sbin/crun"} {
		if isExecutable(p) == nil {
			return &Runtime{Path: p, Global: g}, nil
		}
	}
	return nil, errors.New("crun not found: tclone delegates to crun, so install it " +
		"(hack/setup-host.sh does, or `apt-get install crun`) or point $" + EnvBinary + " at the binary")
}

func isExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

func (r *Runtime) argv(verb string, args []string) []string {
	argv := append([]string{r.Path}, r.Global.Args()...)
	argv = append(argv, verb)
	return append(argv, args...)
}

// Exec replaces the current process with crun. Stdio, every inherited file
// descriptor, the process ID and therefore signals and the exit status pass
// through untouched: to conmon, tclone simply is crun. crun's environment
// is tclone's with env added, a variable of env replacing tclone's of the
// same name.
func (r *Runtime) Exec(verb string, args, env []string) error {
	argv := r.argv(verb, args)
	// exec.Cmd's environment is the one to hand execve: it keeps the last
	// of the variables with the same name.
	environ := (&exec.Cmd{Env: append(os.Environ(), env...)}).Environ()
	err := syscall.Exec(r.Path, argv, environ)
	return fmt.Errorf("exec %s: %w", r.Path, err)
}

// ExitError is returned when crun ran and exited non-zero.
type ExitError struct {
	Verb   string
	Code   int
	Stderr string
}

func (e *ExitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = fmt.Sprintf("exit status %d", e.Code)
	}
	return fmt.Sprintf("crun %s: %s", e.Verb, msg)
}

// Command builds a crun child process for verb. The caller wires its stdio.
func (r *Runtime) Command(ctx context.Context, verb string, args ...string) *exec.Cmd {
	argv := r.argv(verb, args)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	return cmd
}

// Output runs crun verb and returns its standard output. Standard error is
// kept for the error message.
func (r *Runtime) Output(ctx context.Context, verb string, args ...string) ([]byte, error) {
	cmd := r.Command(ctx, verb, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, wrapExit(verb, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func wrapExit(verb string, err error, stderr string) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &ExitError{Verb: verb, Code: ee.ExitCode(), Stderr: stderr}
	}
	return fmt.Errorf("crun %s: %w", verb, err)
}

// Version returns what `crun --version` prints, every line (tclone
// --version passes it on whole, as crun would print it).
func (r *Runtime) Version(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, r.Path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("crun --version: %w", err)
	}
	return string(out), nil
}
