package hostagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/shim/podmanfork"
)

// waitRunning waits until both Podman and crun say the sibling runs, and
// records what Podman knows of it. It needs nothing in the sibling's image.
func (f *forker) waitRunning(ctx context.Context, r *podmanfork.Result) error {
	for {
		data, err := containers.Inspect(ctx, r.ID, nil)
		if err != nil {
			return fmt.Errorf("inspecting it after its restore: %w", err)
		}
		podmanSays := podmanState(data)
		crunSays, crunErr := f.crunState(ctx, r.ID)
		if podmanSays == define.ContainerStateRunning.String() && crunSays == crun.StatusRunning {
			f.recordInspect(r, data)
			r.RunningMs = ms(time.Since(f.start))
			return nil
		}
		if podmanSays == define.ContainerStateExited.String() || podmanSays == define.ContainerStateStopped.String() {
			return fmt.Errorf("it %s right after its restore (exit code %d); see `podman logs %s`", podmanSays, data.State.ExitCode, r.Name)
		}
		select {
		case <-ctx.Done():
			if crunErr != nil {
				crunSays = crunErr.Error()
			}
			return fmt.Errorf("not running within %s: Podman says %s, crun says %s", f.opts.ReadyTimeout, podmanSays, crunSays)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func podmanState(data *define.InspectContainerData) string {
	switch {
	case data.State == nil:
		return "unknown"
	case data.State.Paused:
		return define.ContainerStatePaused.String()
	case data.State.Running:
		return define.ContainerStateRunning.String()
	}
	return data.State.Status
}

// crunState is crun's own view of the sibling: tclone runs containers as
// crun containers, so crun's state is the runtime's, under the root crun
// ran the source under (the plan records it).
func (f *forker) crunState(ctx context.Context, id string) (string, error) {
	if f.crun == nil {
		rt, err := crun.Find(crun.Global{Root: f.crunRoot})
		if err != nil {
			return "", err
		}
		f.crun = rt
	}
	st, err := f.crun.State(ctx, id)
	if err != nil {
		return "", err
	}
	return st.Status, nil
}

func (f *forker) recordInspect(r *podmanfork.Result, data *define.InspectContainerData) {
	if data.NetworkSettings != nil {
		r.IP = data.NetworkSettings.IPAddress
		for _, n := range data.NetworkSettings.Networks {
			if r.IP == "" && n != nil {
				r.IP = n.IPAddress
			}
		}
	}
	if r.Hostname == "" && data.Config != nil {
		r.Hostname = data.Config.Hostname
	}
	f.setPid(r, data.State.Pid)
}

// hooks runs the user's hooks in a new sibling, with sh -c.
func (f *forker) hooks(ctx context.Context, r *podmanfork.Result) error {
	t := time.Now()
	for _, hook := range f.opts.Hooks {
		res, err := execIn(ctx, r.ID, []string{"sh", "-c", hook})
		var missing *missingCommandError
		switch {
		case errors.As(err, &missing):
			return fmt.Errorf("hook %q: hooks run with sh -c, and the sibling's image has no sh (exit %d); fork without --hook, or use an image with a shell", hook, missing.code)
		case ctx.Err() != nil:
			return fmt.Errorf("hook %q did not finish within the ready timeout (%s)", hook, f.opts.ReadyTimeout)
		case err != nil:
			return fmt.Errorf("hook %q: %w", hook, err)
		case res.code != 0:
			return fmt.Errorf("hook %q exited with status %d: %s", hook, res.code, res.output)
		}
		f.firstCommand(r)
	}
	r.HookMs = ms(time.Since(t))
	return nil
}

// readyCommand is what --ready exec runs.
var readyCommand = []string{"true"}

// ready waits until the sibling meets the readiness condition. It runs
// after waitRunning, so `running` is already met.
func (f *forker) ready(ctx context.Context, r *podmanfork.Result) error {
	t := time.Now()
	var check func() error
	switch f.opts.Ready.Kind {
	case podmanfork.ReadyExec:
		check = func() error { return f.readyExec(ctx, r) }
	case podmanfork.ReadyTCP, podmanfork.ReadyHTTP:
		if r.IP == "" {
			return fmt.Errorf("readiness %s needs the sibling's IP, and it has none (no network?)", f.opts.Ready)
		}
		check = probe(f.opts.Ready, r.IP)
	default:
		r.ReadyMs = ms(time.Since(t))
		return nil
	}
	var last error
	for {
		if last = check(); last == nil {
			break
		}
		var fatal *fatalReadyError
		if errors.As(last, &fatal) {
			return fatal.err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (%s) within %s: %v", f.opts.Ready, f.opts.ReadyTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	r.ReadyMs = ms(time.Since(t))
	return nil
}

// fatalReadyError ends the readiness wait at once: waiting cannot help.
type fatalReadyError struct{ err error }

func (e *fatalReadyError) Error() string { return e.err.Error() }

// readyExecAttempt bounds one attempt of --ready exec. The Podman service
// has been seen to keep an exec's output stream open after the command
// ended; `true` ends too fast to be seen running, so such an attempt
// cannot be told from one still starting, and only its bound ends it. The
// readiness command is harmless to run again, and the next attempt, in a
// session of its own, is tried until the ready timeout.
var readyExecAttempt = 10 * time.Second

// runExec runs a command in a container (execIn; a test replaces it).
var runExec = execIn

func (f *forker) readyExec(ctx context.Context, r *podmanfork.Result) error {
	actx, cancel := context.WithTimeout(ctx, readyExecAttempt)
	defer cancel()
	res, err := runExec(actx, r.ID, readyCommand)
	var missing *missingCommandError
	switch {
	case errors.As(err, &missing):
		return &fatalReadyError{fmt.Errorf("readiness exec runs %q in the sibling, and its image has none (exit %d); use --ready running, which needs nothing in the image", readyCommand[0], missing.code)}
	case err != nil:
		return err
	case res.code != 0:
		return &fatalReadyError{fmt.Errorf("readiness exec: %q exited with status %d: %s", readyCommand[0], res.code, res.output)}
	}
	f.firstCommand(r)
	return nil
}

// probe checks a tcp: or http: readiness condition once.
func probe(ready podmanfork.Ready, ip string) func() error {
	addr := net.JoinHostPort(ip, strconv.Itoa(ready.Port))
	if ready.Kind == podmanfork.ReadyTCP {
		return func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}
	}
	url := fmt.Sprintf("http://%s%s", addr, ready.Path)
	client := &http.Client{Timeout: 2 * time.Second}
	return func() error {
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

// firstCommand records when the first command answered in the sibling.
func (f *forker) firstCommand(r *podmanfork.Result) {
	if r.FirstCommandMs == 0 {
		r.FirstCommandMs = ms(time.Since(f.start))
	}
}

// waitMemoryAll waits until every sibling has all of its memory, each
// within the ready timeout.
func (f *forker) waitMemoryAll(ctx context.Context, siblings []*podmanfork.Result) error {
	ctx, cancel := context.WithTimeout(ctx, f.opts.ReadyTimeout)
	defer cancel()
	errs := make([]error, len(siblings))
	var wg sync.WaitGroup
	for i, r := range siblings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.waitMemory(ctx, r); err != nil {
				errs[i] = fmt.Errorf("sibling %d of %d (%s): %w", i+1, len(siblings), r.Name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitMemory waits until the sibling's tasks have all of their memory.
func (f *forker) waitMemory(ctx context.Context, r *podmanfork.Result) error {
	for {
		task, err := fork.MemoryFilling(f.pid(r))
		if err != nil {
			return fmt.Errorf("waiting for its memory: %w", err)
		}
		if task == 0 {
			r.MemoryCompleteMs = ms(time.Since(f.start))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("its memory was not complete within the ready timeout (%s); task %d still receives it", f.opts.ReadyTimeout, task)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
