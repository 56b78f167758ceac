package kubefork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/shim/criimage"
)

// ctrTool runs containerd's ctr on the CRI's namespace of one containerd.
type ctrTool struct {
	path, address string
}

func (c ctrTool) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.path, append([]string{"--address", c.address, "--namespace", containerdNamespace}, args...)...)
	// A ctr outlives a client killed with SIGKILL otherwise.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (c ctrTool) run(cmd *exec.Cmd, args []string) error {
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("ctr %s: %s", strings.Join(args, " "), lastLine(msg))
	}
	return nil
}

// importImage writes the checkpoint image of archive named name straight
// into containerd (ctr images import from a pipe), unpacked for the CRI's
// snapshotter, as a pulled image is.
func (c ctrTool) importImage(ctx context.Context, name, archive string, annotations map[string]string) (*criimage.Image, error) {
	args := []string{"images", "import", "-"}
	cmd := c.command(ctx, args...)
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	written := make(chan error, 1)
	var img *criimage.Image
	go func() {
		var err error
		img, err = criimage.Write(pw, name, archive, annotations)
		pw.CloseWithError(err)
		written <- err
	}()
	err := c.run(cmd, args)
	pr.CloseWithError(io.ErrClosedPipe)
	werr := <-written
	switch {
	case err != nil:
		// ctr's own reason; the writer only saw the pipe close.
		return nil, errors.Join(err, c.remove(name))
	case werr != nil:
		return nil, errors.Join(fmt.Errorf("writing the checkpoint image: %w", werr), c.remove(name))
	}
	return img, nil
}

func (c ctrTool) push(ctx context.Context, name string, plainHTTP bool, hostsDir string) error {
	args := []string{"images", "push"}
	if plainHTTP {
		args = append(args, "--plain-http")
	}
	if hostsDir != "" {
		args = append(args, "--hosts-dir", hostsDir)
	}
	args = append(args, name)
	return c.run(c.command(ctx, args...), args)
}

// remove removes image name from containerd, if it is there.
func (c ctrTool) remove(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"images", "rm", name}
	cmd := c.command(ctx, args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil && !strings.Contains(errb.String(), "not found") {
		return fmt.Errorf("removing the image %s made so far: %s", name, lastLine(errb.String()))
	}
	return nil
}

// taskStatus is the status containerd gives the task of container id
// (RUNNING, PAUSED, STOPPED...), "" when it has none.
func (c ctrTool) taskStatus(ctx context.Context, id string) (string, error) {
	args := []string{"tasks", "ls"}
	cmd := c.command(ctx, args...)
	var out strings.Builder
	cmd.Stdout = &out
	if err := c.run(cmd, args); err != nil {
		return "", err
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == id {
			return f[2], nil
		}
	}
	return "", nil
}

// resumeIfPaused resumes the task of container id if it is paused: a CRI
// checkpoint call that failed on its deadline skips containerd's resume of
// the container it paused (its context is gone), and the container would
// stay frozen.
func (c ctrTool) resumeIfPaused(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.taskStatus(ctx, id)
	if err != nil || st != "PAUSED" {
		return err
	}
	logrus.Warnf("the CRI's checkpoint call left container %s paused: resuming it", id)
	args := []string{"tasks", "resume", id}
	if err := c.run(c.command(ctx, args...), args); err != nil {
		return fmt.Errorf("the CRI's checkpoint call left container %s paused, and resuming it failed: %w", id, err)
	}
	return nil
}
