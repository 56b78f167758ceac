// Package criuhooks drives CRIU through go-criu's swrk RPC and implements the
// notification callbacks tclone needs at CRIU's phase boundaries. It holds no
// global state: each call gets its options and its hooks.
package criuhooks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
)

// Error is a failed CRIU operation, with the lines of CRIU's log that say why.
type Error struct {
	Op      string   // "dump" or "restore"
	Err     error    // what go-criu returned
	Reasons []string // "Error (...)" lines from CRIU's log, oldest first
	LogPath string
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "criu %s failed", e.Op)
	// A hook of tclone's that failed is the reason; CRIU's log then only
	// says that a script failed. Otherwise CRIU's log says why; go-criu's
	// own message repeats CRIU's first error line, which is usually a
	// harmless warning, so it is shown only when the log has nothing, or
	// when tclone itself ended the call.
	var hook *HookError
	if errors.As(e.Err, &hook) || len(e.Reasons) == 0 || errors.Is(e.Err, ErrTimeout) {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if len(e.Reasons) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(e.Reasons, "; "))
	}
	if e.LogPath != "" {
		fmt.Fprintf(&b, " (full log: %s)", e.LogPath)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrTimeout reports a CRIU operation that did not finish in time and was
// killed.
var ErrTimeout = errors.New("timed out")

// Request describes one CRIU swrk call.
type Request struct {
	CriuPath string
	// Env is added to the criu process's environment (CRIU_FAULT, ...).
	Env []string
	// Timeout bounds the whole call. On expiry the criu process is killed,
	// which makes CRIU's tracees resume, and the call fails with ErrTimeout.
	Timeout time.Duration
	Opts    *rpc.CriuOpts
	// LogPath is where CRIU writes its log (work dir + log file name); its
	// error lines are quoted when the call fails.
	LogPath string
	// OnTimeout runs the moment the timeout expires, before the call is
	// unwound: a hook may still be running then, and whatever it keeps
	// waiting (a frozen source) must not wait for it.
	OnTimeout func()
}

// Dump runs a CRIU dump with the given hooks.
func Dump(ctx context.Context, req Request, hooks criu.Notify) error {
	return run(ctx, "dump", req, func(c *criu.Criu) error { return c.Dump(req.Opts, namedHooks{hooks}) })
}

func run(ctx context.Context, op string, req Request, call func(*criu.Criu) error) error {
	c := criu.MakeCriu()
	if req.CriuPath != "" {
		c.SetCriuPath(req.CriuPath)
	}
	restoreEnv := setEnv(req.Env)
	defer restoreEnv()

	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	before := childPids()
	done := make(chan error, 1)
	go func() { done <- call(c) }()

	select {
	case err := <-done:
		if err != nil {
			return &Error{Op: op, Err: err, Reasons: LogErrors(req.LogPath), LogPath: req.LogPath}
		}
		return nil
	case <-ctx.Done():
		if req.OnTimeout != nil {
			req.OnTimeout()
		}
		killNewChildren(before, filepath.Base(criuPath(req)))
		err := <-done
		cause := ctx.Err()
		if errors.Is(cause, context.DeadlineExceeded) {
			cause = ErrTimeout
			if req.Timeout > 0 {
				cause = fmt.Errorf("%w after %s", ErrTimeout, req.Timeout)
			}
		}
		if err != nil {
			cause = fmt.Errorf("%w (%v)", cause, err)
		}
		return &Error{Op: op, Err: cause, Reasons: LogErrors(req.LogPath), LogPath: req.LogPath}
	}
}

func criuPath(req Request) string {
	if req.CriuPath != "" {
		return req.CriuPath
	}
	return "criu"
}

// setEnv applies env for the criu child go-criu is about to start (it
// inherits ours) and returns a function that undoes it.
func setEnv(env []string) func() {
	var undo []func()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		old, had := os.LookupEnv(k)
		os.Setenv(k, v)
		undo = append(undo, func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		})
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

// childPids lists this process's direct children.
func childPids() map[int]bool {
	pids := map[int]bool{}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids[pid] = true
			}
		}
	}
	return pids
}

// criuChild finds the criu process serving the current call: the child of
// this process running criu. tclone runs one CRIU call at a time.
func criuChild() (int, error) {
	for pid := range childPids() {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(data)) == "criu" {
			return pid, nil
		}
	}
	return 0, errors.New("cannot find the criu process of this call")
}

// killNewChildren kills the criu process go-criu started for this call. go-criu
// does not expose it, so it is found as the child that appeared since the call
// began and runs the criu binary.
func killNewChildren(before map[int]bool, comm string) {
	for pid := range childPids() {
		if before[pid] {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(data)) != comm {
			continue
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// LogErrors returns the "Error" lines of a CRIU log, the last few of them,
// with CRIU's timestamps stripped. They are what a user needs to see.
func LogErrors(path string) []string {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "Error (") {
			continue
		}
		// Every criu run prints this; it is harmless without CAP_SYS_RESOURCE.
		if strings.Contains(line, "Can't setup RLIMIT_NOFILE") {
			continue
		}
		if i := strings.Index(line, ") "); strings.HasPrefix(line, "(") && i > 0 {
			line = line[i+2:]
		}
		lines = append(lines, strings.TrimSpace(line))
	}
	const keep = 6
	if len(lines) > keep {
		lines = lines[len(lines)-keep:]
	}
	return lines
}
