package crun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/cgroups"
)

// RestoreCheckpoint has crun restore an ordinary (non-fork) checkpoint,
// with the caller's stdio and exit status. crun leaves the container's
// cgroup behind when a restore fails, and the next container with the same
// cgroup path then cannot start; so a failed restore's cgroup is removed
// here, unless crun kept a container under that ID.
func (r *Runtime) RestoreCheckpoint(ctx context.Context, id, bundle string, args []string, env []string) error {
	if bundle == "" {
		bundle = "." // crun's default
	}
	if err := PrepareRestore(bundle); err != nil {
		return fmt.Errorf("restoring %s: %w", id, err)
	}
	cmd := r.Command(ctx, "restore", append(args, id)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	// tclone stands between the caller and crun here; what the caller
	// signals (a foreground restore is a running container) goes to crun.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	go func() {
		for sig := range sigs {
			cmd.Process.Signal(sig)
		}
	}()
	err := cmd.Wait()
	signal.Stop(sigs)
	close(sigs)
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(filepath.Join(r.Global.StateRoot(), id)); serr != nil {
		if path, lerr := bundleCgroupsPath(bundle); lerr == nil {
			if cerr := cgroups.RemoveLeftovers(path); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		// crun said why on stderr; pass its status through, as a shell
		// would for a signal.
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return &ExitStatus{Code: code, Err: fmt.Errorf("crun restore of %s failed", id)}
	}
	return err
}

// ExitStatus is a failure whose exit status the command passes through.
type ExitStatus struct {
	Code int
	Err  error
}

func (e *ExitStatus) Error() string { return e.Err.Error() }
func (e *ExitStatus) ExitCode() int { return e.Code }
func (e *ExitStatus) Unwrap() error { return e.Err }

// bundleCgroupsPath reads the cgroup a bundle's container is put in.
func bundleCgroupsPath(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", err
	}
	if spec.Linux == nil {
		return "", nil
	}
	return spec.Linux.CgroupsPath, nil
}
