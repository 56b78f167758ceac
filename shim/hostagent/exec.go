package hostagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/api/handlers"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	dockerContainer "github.com/docker/docker/api/types/container"
)

// execResult is a command that ran in a sibling.
type execResult struct {
	code   int
	output string // stdout and stderr, without the service's own noise
}

// missingCommandError says the sibling's image lacks the command asked for.
type missingCommandError struct {
	command string
	code    int
}

func (e *missingCommandError) Error() string {
	return fmt.Sprintf("executable %q not found in the container (exit %d)", e.command, e.code)
}

// execIn runs argv in a container through the API. The exec session is
// removed before it returns, whatever happened.
func execIn(ctx context.Context, id string, argv []string) (*execResult, error) {
	session, err := containers.ExecCreate(ctx, id, &handlers.ExecCreateConfig{
		ExecConfig: dockerContainer.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true},
	})
	if err != nil {
		return nil, fmt.Errorf("creating an exec session: %w", err)
	}
	defer removeExec(ctx, session)
	var buf syncBuffer
	var w io.Writer = &buf
	attach := true
	actx, release, err := attachConnection(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting to run %q: %w", argv[0], err)
	}
	done := make(chan error, 1)
	go func() {
		defer release()
		done <- containers.ExecStartAndAttach(actx, session, &containers.ExecStartAndAttachOptions{
			OutputStream: &w, ErrorStream: &w, AttachOutput: &attach, AttachError: &attach,
		})
	}()
	inspect := func(ctx context.Context) (*define.InspectExecSession, error) {
		return containers.ExecInspect(ctx, session, nil)
	}
	ended, attachErr := waitExec(ctx, inspect, done)
	// When the command cannot start, the service's attach stream breaks
	// (`read unixpacket ...attach: connection reset by peer`): the exit
	// code, not the stream, says what happened. It is read even when ctx
	// ended while the stream stayed open.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	info, err := inspect(ictx)
	if err != nil {
		if attachErr != nil {
			return nil, fmt.Errorf("running %q: %w", argv[0], attachErr)
		}
		return nil, fmt.Errorf("reading the exit status of %q: %w", argv[0], err)
	}
	if info.Running {
		return nil, fmt.Errorf("running %q: the exec session broke off while the command still ran: %v", argv[0], attachErr)
	}
	// "Not running, exit 0" is also what a session that never started
	// says: only a command seen to end has an exit status to trust.
	if !ended {
		return nil, fmt.Errorf("running %q: %v; whether it ran cannot be told", argv[0], attachErr)
	}
	out := cleanExecOutput(buf.String())
	if commandMissing(info.ExitCode, out, argv[0]) {
		return nil, &missingCommandError{command: argv[0], code: info.ExitCode}
	}
	return &execResult{code: info.ExitCode, output: out}, nil
}

// attachConnection is the connection one exec's attach stream uses, and
// what to call once the stream ended. The bindings' ExecStartAndAttach
// swaps its connection's transport to catch the socket it dials: two at
// once on one connection race, and one of them then reads from no socket
// and panics (seen with hooks in siblings restored in parallel). So each
// attach gets a connection of its own, whose idle sockets are closed after
// it. A fork runs its execs where Podman's service is local (a fork through
// ssh runs in tclone's service, on that host): a connection over ssh,
// which cannot be opened again without its key, is used as it is.
func attachConnection(ctx context.Context) (context.Context, func(), error) {
	conn, err := bindings.GetClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	if s := conn.URI.Scheme; s != "unix" && s != "tcp" {
		return ctx, func() {}, nil
	}
	actx, err := bindings.NewConnection(ctx, conn.URI.String())
	if err != nil {
		return nil, nil, err
	}
	own, err := bindings.GetClient(actx)
	if err != nil {
		return nil, nil, err
	}
	// The connection's check of the service left a socket idle in the
	// transport the attach replaces.
	own.Client.CloseIdleConnections()
	return actx, own.Client.CloseIdleConnections, nil
}

// attachGrace is how long the attach stream may stay open after the
// command is seen to have exited: its last output is on the way.
const attachGrace = 2 * time.Second

// waitExec waits for the attach stream to end. The Podman service has been
// seen to keep it open after the command exited, and the bindings then read
// it for ever whatever the context says. So the session is watched too: the
// stream is given up attachGrace after the command is seen exiting, and
// when ctx ends. (A command too short to be seen running is seen exiting
// only by a non-zero code; otherwise ctx bounds the wait.) The reading
// goroutine ends when the connection does.
//
// ended says whether the command is known to have ended: its stream ended,
// or it was seen exiting.
func waitExec(ctx context.Context, inspect func(context.Context) (*define.InspectExecSession, error), done <-chan error) (ended bool, err error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var ran bool
	var exited time.Time
	for {
		select {
		case err := <-done:
			return true, err
		case <-ctx.Done():
			return false, fmt.Errorf("its output stream did not end: %w", ctx.Err())
		case <-tick.C:
		}
		info, err := inspect(ctx)
		switch {
		case err != nil:
			continue
		case info.Running:
			ran = true
			continue
		case !ran && info.ExitCode == 0:
			continue // not started yet, or done with 0: cannot tell
		}
		if exited.IsZero() {
			exited = time.Now()
		} else if time.Since(exited) > attachGrace {
			return true, fmt.Errorf("the service kept its output stream open %s after it exited", attachGrace)
		}
	}
}

// syncBuffer is a buffer the attach goroutine writes while execIn may read.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// removeExec removes an exec session at once. Podman would keep it, and the
// conmon that ran it, for its exit-command delay (five minutes).
func removeExec(ctx context.Context, session string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	containers.ExecRemove(ctx, session, new(containers.ExecRemoveOptions).WithForce(true))
	reapExecConmon(session)
}

// attachNoise matches the lines the Podman service writes into an exec's
// stream when its attach socket breaks; they describe the service's
// plumbing, not the command.
var attachNoise = regexp.MustCompile(`(?m)^(Error: )?.*(unixpacket|/attach: ).*(\n|$)`)

func cleanExecOutput(out string) string {
	return strings.TrimSpace(attachNoise.ReplaceAllString(out, ""))
}

// commandMissing recognises the OCI runtime's answer to a command that is
// not in the image: crun exits 127 (126 when it is not executable) saying
// "executable file `X` not found".
func commandMissing(code int, out, command string) bool {
	if code != 127 && code != 126 {
		return false
	}
	return strings.Contains(out, "executable file `"+command+"`") ||
		strings.Contains(out, "executable file not found")
}
