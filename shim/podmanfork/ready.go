package podmanfork

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containers/podman/v5/pkg/api/handlers"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	dockerContainer "github.com/docker/docker/api/types/container"
)

// identify runs the user's hooks in a new sibling. The sibling's own
// hostname and machine-id are set by tclone while it is restored.
func (f *forker) identify(ctx context.Context, r *Result) error {
	t := time.Now()
	for _, hook := range f.opts.Hooks {
		code, out, err := execIn(ctx, r.ID, []string{"sh", "-c", hook})
		if err != nil {
			return fmt.Errorf("hook %q: %w", hook, err)
		}
		if code != 0 {
			return fmt.Errorf("hook %q exited with status %d: %s", hook, code, strings.TrimSpace(out))
		}
		f.firstCommand(r)
	}
	r.HookMs = ms(time.Since(t))
	return nil
}

// ready waits until the sibling meets the readiness condition, then records
// the first command answered in it.
func (f *forker) ready(ctx context.Context, r *Result) error {
	t := time.Now()
	data, err := containers.Inspect(ctx, r.ID, nil)
	if err != nil {
		return err
	}
	if data.State == nil || !data.State.Running {
		return fmt.Errorf("not running after restore (state %v)", data.State)
	}
	if data.NetworkSettings != nil {
		r.IP = data.NetworkSettings.IPAddress
		for _, n := range data.NetworkSettings.Networks {
			if r.IP == "" && n != nil {
				r.IP = n.IPAddress
			}
		}
	}
	if r.Hostname == "" {
		r.Hostname = data.Config.Hostname
	}
	var check func() error
	switch f.opts.Ready.Kind {
	case ReadyRunning, ReadyExec:
		check = func() error { return nil }
	case ReadyTCP:
		check = func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(r.IP, strconv.Itoa(f.opts.Ready.Port)), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}
	case ReadyHTTP:
		url := fmt.Sprintf("http://%s%s", net.JoinHostPort(r.IP, strconv.Itoa(f.opts.Ready.Port)), f.opts.Ready.Path)
		client := &http.Client{Timeout: 2 * time.Second}
		check = func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 400 {
				return fmt.Errorf("GET %s: %s", url, resp.Status)
			}
			return nil
		}
	}
	if (f.opts.Ready.Kind == ReadyTCP || f.opts.Ready.Kind == ReadyHTTP) && r.IP == "" {
		return fmt.Errorf("readiness %s needs the sibling's IP, and it has none (no network?)", f.opts.Ready)
	}
	var last error
	for {
		if last = check(); last == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (%s) within %s: %v", f.opts.Ready, f.opts.ReadyTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Every readiness kind ends with a command answered in the sibling:
	// it is the latency the user sees, and proves exec works.
	if r.FirstCommandMs == 0 {
		code, out, err := execIn(ctx, r.ID, []string{"true"})
		if err != nil {
			return fmt.Errorf("first command: %w", err)
		}
		if code != 0 {
			return fmt.Errorf("first command (true) exited %d: %s", code, out)
		}
		f.firstCommand(r)
	}
	r.ReadyMs = ms(time.Since(t))
	return nil
}

func (f *forker) firstCommand(r *Result) {
	if r.FirstCommandMs == 0 {
		r.FirstCommandMs = ms(time.Since(f.start))
	}
}

// execIn runs argv in a container through the API and returns its exit
// status and combined output.
func execIn(ctx context.Context, id string, argv []string) (int, string, error) {
	session, err := containers.ExecCreate(ctx, id, &handlers.ExecCreateConfig{
		ExecConfig: dockerContainer.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true},
	})
	if err != nil {
		return 0, "", err
	}
	defer containers.ExecRemove(context.WithoutCancel(ctx), session, nil)
	var buf bytes.Buffer
	var w io.Writer = &buf
	attach := true
	err = containers.ExecStartAndAttach(ctx, session, &containers.ExecStartAndAttachOptions{
		OutputStream: &w, ErrorStream: &w, AttachOutput: &attach, AttachError: &attach,
	})
	if err != nil {
		return 0, buf.String(), err
	}
	info, err := containers.ExecInspect(ctx, session, nil)
	if err != nil {
		return 0, buf.String(), err
	}
	return info.ExitCode, buf.String(), nil
}
