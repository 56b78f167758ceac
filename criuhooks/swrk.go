// Package criuhooks drives CRIU through its swrk RPC (go-criu's messages)
// and implements the notification callbacks tclone needs at CRIU's phase
// boundaries. It holds no global state: each call gets its options, its
// environment and its hooks.
package criuhooks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/runtime/procfs"
)

// Error is a failed CRIU operation, with the lines of CRIU's log that say why.
type Error struct {
	Op      string   // "dump" or "restore"
	Err     error    // how the call failed: CRIU's answer, a hook's error, a timeout
	Reasons []string // "Error (...)" lines from CRIU's log, oldest first
	LogPath string
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "criu %s failed", e.Op)
	// A hook of tclone's that failed is the reason; CRIU's log then only
	// says that a script failed. Otherwise CRIU's log says why; CRIU's
	// answer repeats its first error line, which is usually a harmless
	// warning (RLIMIT_NOFILE, which LogErrors leaves out), so it is shown
	// only when the log has nothing, or when tclone itself ended the call.
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

// Dump runs a CRIU dump with the given hooks (nil: CRIU sends no
// notification). Hooks that implement CriuStarted learn the criu process's
// PID before CRIU is asked anything.
func Dump(ctx context.Context, req Request, hooks criu.Notify) error {
	return run(ctx, "dump", req, &rpc.CriuReq{Type: rpc.CriuReqType_DUMP.Enum(), Opts: req.Opts}, hooks)
}

// CriuStarted is implemented by hooks that need the PID of the criu
// process serving their call.
type CriuStarted interface {
	CriuStarted(pid int)
}

func run(ctx context.Context, op string, req Request, call *rpc.CriuReq, hooks criu.Notify) error {
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	s, err := startSwrk(criuPath(req), req.Env, nil)
	if err != nil {
		return &Error{Op: op, Err: err, Reasons: LogErrors(req.LogPath), LogPath: req.LogPath}
	}
	var notify criu.Notify
	if hooks != nil {
		if cs, ok := hooks.(CriuStarted); ok {
			cs.CriuStarted(s.cmd.Process.Pid)
		}
		notify = namedHooks{hooks}
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.call(call, notify)
		done <- s.finish(err)
	}()

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
		s.cmd.Process.Kill()
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

// Version asks the criu at path for its version, with env added to its
// environment.
func Version(ctx context.Context, path string, env []string) (*rpc.CriuVersion, error) {
	resp, err := ask(ctx, path, env, &rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()})
	if err == nil && resp.GetVersion() == nil {
		err = errors.New("criu's answer to a version request holds no version")
	}
	return resp.GetVersion(), err
}

// Features asks the criu at path which of the features set in want this
// CRIU can use on this kernel, with env added to its environment. Those
// asked about are set in the answer, true or false. (go-criu v7's
// FeatureCheck returns the features asked about, not CRIU's answer.)
func Features(ctx context.Context, path string, env []string, want *rpc.CriuFeatures) (*rpc.CriuFeatures, error) {
	resp, err := ask(ctx, path, env, &rpc.CriuReq{Type: rpc.CriuReqType_FEATURE_CHECK.Enum(), Features: want})
	if err == nil && resp.GetFeatures() == nil {
		err = errors.New("criu's answer to a feature check holds no features")
	}
	return resp.GetFeatures(), err
}

// ask makes one request of a criu swrk of its own, which ctx's end kills.
// The error of a failed request ends with what criu wrote to its standard
// error (a missing library, say).
func ask(ctx context.Context, path string, env []string, req *rpc.CriuReq) (*rpc.CriuResp, error) {
	var stderr bytes.Buffer
	s, err := startSwrk(path, env, &stderr)
	if err != nil {
		return nil, err
	}
	// Bounded until criu is reaped: a criu that does not end when its
	// socket closes is killed at the deadline too.
	stop := context.AfterFunc(ctx, func() { s.cmd.Process.Kill() })
	resp, err := s.call(req, nil)
	err = s.finish(err)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if out := strings.TrimSpace(stderr.String()); out != "" {
			err = fmt.Errorf("%w: %s", err, out)
		}
		return nil, err
	}
	return resp, nil
}

// swrk is a criu process serving CRIU's RPC on a socket of its own
// (`criu swrk FD`): tclone's way to run CRIU, one call per process.
// tclone starts it itself rather than through go-criu's Criu, which
// starts criu with tclone's own environment only: so each call gives criu
// an environment of its own, and a call that runs out of time kills the
// very process it started.
type swrk struct {
	cmd *exec.Cmd
	sk  *os.File
}

// exitGrace is how long a read of criu's socket may still take once criu
// has exited: what criu sent before it exited is read at once.
const exitGrace = time.Second

// startSwrk starts criu swrk, with env added to (or replacing variables
// of) tclone's environment, and its standard error to stderr (nil: none).
func startSwrk(path string, env []string, stderr io.Writer) (*swrk, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("a socket for criu: %w", err)
	}
	// tclone's end is non-blocking, so that os.File polls it and a read
	// can be given a deadline (watchExit); criu's stays blocking.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("a socket for criu: %w", err)
	}
	sk, peer := os.NewFile(uintptr(fds[0]), "criu-swrk"), os.NewFile(uintptr(fds[1]), "criu-swrk-peer")
	defer peer.Close()
	// criu serves the socket it gets as descriptor 3, the first of
	// ExtraFiles.
	cmd := exec.Command(path, "swrk", "3")
	cmd.ExtraFiles = []*os.File{peer}
	// A process group of its own: a signal to tclone's group (^C at a
	// terminal, a hang-up) reaches tclone, which ends the call its own way,
	// and not criu in the middle of a system call it runs in a task.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	// A child of a killed criu holding its standard error must not keep
	// Wait waiting.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		sk.Close()
		return nil, err
	}
	s := &swrk{cmd: cmd, sk: sk}
	s.watchExit()
	return s, nil
}

// watchExit ends the wait for criu's answer once criu has exited. Its end
// of the socket does not close with it when a child of criu's holds a copy:
// one of CRIU's kernel probes forks a child that stops itself with SIGSTOP,
// and a criu killed then leaves that child stopped for good. A read would
// then wait forever. (Without pidfds, before Linux 5.3, reads wait for the
// socket as before.)
func (s *swrk) watchExit() {
	fd, err := unix.PidfdOpen(s.cmd.Process.Pid, 0)
	if err != nil {
		return
	}
	go func() {
		defer unix.Close(fd)
		if exited, _ := procfs.PidfdExited(fd, -1); !exited {
			return // cannot tell: reads wait for the socket, as before
		}
		// After finish closed the socket this fails, harmlessly.
		s.sk.SetReadDeadline(time.Now().Add(exitGrace))
	}()
}

// readQueued reads a datagram criu left in the socket before it exited,
// without waiting: once the read deadline has passed, Read no longer looks.
func (s *swrk) readQueued(buf []byte) (int, error) {
	rc, err := s.sk.SyscallConn()
	if err != nil {
		return 0, err
	}
	n, rerr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
	}); err != nil {
		return 0, err
	}
	return n, rerr
}

// call sends req, answers the notifications CRIU sends meanwhile with
// hooks (nil: a notification is an error), and returns CRIU's answer. An
// answer of another type than req's, or one that says the request failed,
// is an error; so is a hook's error, which is CRIU's as well: the hook is
// not answered, and CRIU stops once finish closes the socket.
func (s *swrk) call(req *rpc.CriuReq, hooks criu.Notify) (*rpc.CriuResp, error) {
	if hooks != nil {
		req.Opts.NotifyScripts = proto.Bool(true)
	}
	// CRIU's answers are a few hundred bytes; a datagram larger than the
	// buffer would be cut, and fail to decode.
	buf := make([]byte, 64<<10)
	typ := req.GetType()
	for {
		msg, err := proto.Marshal(req)
		if err != nil {
			return nil, err
		}
		if _, err := s.sk.Write(msg); err != nil {
			return nil, fmt.Errorf("sending criu a %s request: %w", typ, err)
		}
		n, err := s.sk.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if n, err = s.readQueued(buf); err != nil || n == 0 {
				return nil, fmt.Errorf("criu exited without answering a %s request (a process it started still holds its socket)", typ)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("reading criu's answer to a %s request: %w", typ, err)
		}
		if n == len(buf) {
			// A datagram that filled the buffer may have been cut.
			return nil, fmt.Errorf("criu's answer to a %s request is %d bytes or more, more than tclone reads", typ, n)
		}
		resp := &rpc.CriuResp{}
		if err := proto.Unmarshal(buf[:n], resp); err != nil {
			return nil, fmt.Errorf("decoding criu's answer to a %s request: %w", typ, err)
		}
		if !resp.GetSuccess() {
			if resp.GetCrErrmsg() == "" && resp.GetCrErrno() == 0 {
				return resp, fmt.Errorf("criu's %s failed (its log, when it keeps one, says why)", typ)
			}
			return resp, fmt.Errorf("criu's %s failed: %q (errno %d)", typ, resp.GetCrErrmsg(), resp.GetCrErrno())
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			if resp.GetType() != typ {
				return resp, fmt.Errorf("criu answered a %s request with a %s answer", typ, resp.GetType())
			}
			return resp, nil
		}
		if hooks == nil {
			return resp, fmt.Errorf("criu sent a %s notification during a %s request", resp.GetNotify().GetScript(), typ)
		}
		if err := notify(hooks, resp.GetNotify()); err != nil {
			return resp, err
		}
		req = &rpc.CriuReq{Type: rpc.CriuReqType_NOTIFY.Enum(), NotifySuccess: proto.Bool(true)}
	}
}

// notify runs the hook CRIU's notification n names; one tclone has no hook
// for succeeds.
func notify(hooks criu.Notify, n *rpc.CriuNotify) error {
	switch n.GetScript() {
	case "pre-dump":
		return hooks.PreDump()
	case "post-dump":
		return hooks.PostDump()
	case "pre-restore":
		return hooks.PreRestore()
	case "post-restore":
		return hooks.PostRestore(n.GetPid())
	case "network-lock":
		return hooks.NetworkLock()
	case "network-unlock":
		return hooks.NetworkUnlock()
	case "setup-namespaces":
		return hooks.SetupNamespaces(n.GetPid())
	case "post-setup-namespaces":
		return hooks.PostSetupNamespaces()
	case "post-resume":
		return hooks.PostResume()
	case "dump-resumed":
		if r, ok := hooks.(resumedNotify); ok {
			return r.DumpResumed()
		}
	}
	return nil
}

// resumedNotify takes the notification tclone's build of CRIU sends once a
// dump's tree runs again (criuhooks/criu/dump-resumed.patch), which
// criu.Notify does not know.
type resumedNotify interface{ DumpResumed() error }

// finish closes tclone's end of the socket, which ends criu's service,
// and waits for criu to exit. It returns err, the call's error, with how
// criu ended if that went wrong too.
func (s *swrk) finish(err error) error {
	s.sk.Close()
	werr := s.cmd.Wait()
	if werr != nil {
		werr = fmt.Errorf("criu swrk: %w", werr)
	}
	switch {
	case err == nil:
		return werr
	case werr == nil:
		return err
	}
	return fmt.Errorf("%w (%v)", err, werr)
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
		// CRIU repeats an error as it tries again, or for each thread.
		if line = strings.TrimSpace(line); !slices.Contains(lines, line) {
			lines = append(lines, line)
		}
	}
	// The first error is most often the cause, and the last ones what it
	// failed: both are kept.
	const keep = 6
	if len(lines) > keep {
		lines = append(lines[:1], lines[len(lines)-keep+1:]...)
	}
	return lines
}
