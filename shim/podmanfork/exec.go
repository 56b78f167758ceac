package podmanfork

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/containers/podman/v5/pkg/api/handlers"
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
	var buf bytes.Buffer
	var w io.Writer = &buf
	attach := true
	attachErr := containers.ExecStartAndAttach(ctx, session, &containers.ExecStartAndAttachOptions{
		OutputStream: &w, ErrorStream: &w, AttachOutput: &attach, AttachError: &attach,
	})
	// When the command cannot start, the service's attach stream breaks
	// (`read unixpacket ...attach: connection reset by peer`): the exit
	// code, not the stream, says what happened.
	info, err := containers.ExecInspect(ctx, session, nil)
	if err != nil {
		if attachErr != nil {
			return nil, fmt.Errorf("running %q: %w", argv[0], attachErr)
		}
		return nil, fmt.Errorf("reading the exit status of %q: %w", argv[0], err)
	}
	if info.Running {
		return nil, fmt.Errorf("running %q: the exec session broke off while the command still ran: %v", argv[0], attachErr)
	}
	out := cleanExecOutput(buf.String())
	if commandMissing(info.ExitCode, out, argv[0]) {
		return nil, &missingCommandError{command: argv[0], code: info.ExitCode}
	}
	return &execResult{code: info.ExitCode, output: out}, nil
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
