package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/internal/copyfile"
	"github.com/tclone/tclone/runtime/plan"
)

// CheckpointForIntent serves `tclone checkpoint` when a fork client left an
// intent for the container: instead of a portable checkpoint it captures a
// fork plan, and leaves in imagePath only what Podman reads (inventory.img,
// stats-dump in workPath) plus a reference to the plan. It returns nil, nil
// when there is no intent and the checkpoint is an ordinary one.
func (e *Engine) CheckpointForIntent(ctx context.Context, id, imagePath, workPath string, leaveRunning bool) (*Captured, error) {
	intent, err := e.Store.TakeIntent(id)
	if err != nil || intent == nil {
		return nil, err
	}
	c, err := e.checkpointForIntent(ctx, intent, imagePath, workPath, leaveRunning)
	if err != nil {
		// Podman keeps neither this process's stderr nor a log of it; the
		// client that left the intent reads the reason here.
		if werr := e.Store.WriteIntentResult(intent, err); werr != nil {
			err = errors.Join(err, fmt.Errorf("leaving the failure for the fork client: %w", werr))
		}
		return nil, err
	}
	return c, nil
}

func (e *Engine) checkpointForIntent(ctx context.Context, intent *plan.Intent, imagePath, workPath string, leaveRunning bool) (*Captured, error) {
	id := intent.ContainerID
	// A fork never stops its source; a checkpoint that would (Podman marks
	// the container stopped and tears down its network) is refused.
	if !leaveRunning {
		return nil, fmt.Errorf("container %s has a fork request pending, and a fork checkpoint must leave it running: checkpoint with --leave-running", id)
	}
	if imagePath == "" {
		return nil, fmt.Errorf("a fork checkpoint of %s needs --image-path", id)
	}
	// The plan's uses are kept for the client that asked for them; if it
	// dies, the plan goes at the next sweep instead of at its expiry. The
	// capture records it with the uses, before its journal entry ends.
	req := CaptureRequest{Source: id, Fork: intent.Fork, CallerPaused: intent.CallerPaused}
	if intent.Client.Pid != 0 {
		client := intent.Client
		req.Client = &client
	}
	ctx, stop := e.whileClientWaits(ctx, intent)
	defer stop()
	c, err := e.Capture(ctx, req)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errClientGone) || errors.Is(cause, errClientCancelled) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return nil, err
	}
	// The client may start on what needs only the plan while this
	// checkpoint's caller finishes its own work.
	if err := e.Store.MarkIntentReleased(intent); err != nil {
		logrus.Warnf("telling the fork client of %s that its capture is done: %v", id, err)
	}
	if err := writeCheckpointDir(c, imagePath, workPath); err != nil {
		e.Store.Remove(c.Dir)
		return nil, err
	}
	if intent.CallerPaused {
		e.pauseForCaller(ctx, id)
	}
	return c, nil
}

// pauseForCaller freezes container id, running because tclone left the
// pause of its checkpoint's caller to the capture (plan.Store.
// ClaimCallerPause), for what the caller does before it resumes it:
// containerd archives the container's writable layer, which it must find
// still (a file that goes or changes size under its walk fails its call).
// The source is then held twice, for the capture and for that archive, and
// never for both at once; the caller's resume thaws it, even when its call
// fails. A container frozen already (its pause was not left to the
// capture) is left as it is.
func (e *Engine) pauseForCaller(ctx context.Context, id string) {
	// Whether or not the client still waits: the caller's call goes on.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	st, err := e.Crun.State(ctx, id)
	if err != nil || st.Status != crun.StatusRunning {
		return
	}
	if _, err := e.Crun.Output(ctx, "pause", id); err != nil {
		logrus.Warnf("pausing %s again for the rest of its checkpoint's call (its caller archives its filesystem next): %v", id, err)
	}
}

func writeCheckpointDir(c *Captured, imagePath, workPath string) error {
	if err := os.MkdirAll(imagePath, 0o700); err != nil {
		return fmt.Errorf("creating checkpoint directory: %w", err)
	}
	// Podman refuses a restore without CRIU's inventory. A files-only
	// plan has none: an empty file is all Podman looks for.
	inventory := filepath.Join(imagePath, "inventory.img")
	if c.Plan.FilesOnly {
		if err := os.WriteFile(inventory, nil, 0o600); err != nil {
			return fmt.Errorf("writing inventory.img into the checkpoint directory: %w", err)
		}
	} else if err := copyfile.Copy(filepath.Join(plan.ImagesDir(c.Dir), "inventory.img"), inventory, os.O_TRUNC); err != nil {
		return fmt.Errorf("writing inventory.img into the checkpoint directory: %w", err)
	}
	// Podman reads CRIU's dump statistics from the work directory for
	// --print-stats, where CRIU itself would have left them.
	if workPath != "" && !c.Plan.FilesOnly {
		if err := copyfile.Copy(filepath.Join(plan.WorkDir(c.Dir), "stats-dump"), filepath.Join(workPath, "stats-dump"), os.O_TRUNC); err != nil {
			return fmt.Errorf("writing stats-dump into the work directory: %w", err)
		}
	}
	return plan.WriteReference(imagePath, plan.Reference{PlanID: c.Plan.ID, PlanDir: c.Dir, SourceID: c.Plan.Source.ID})
}

var (
	errClientGone      = errors.New("the fork client is gone")
	errClientCancelled = errors.New("the fork client cancelled the fork")
)

// clientPoll is how often a capture looks whether its client still waits.
const clientPoll = 20 * time.Millisecond

// clientChecked is called each time whileClientWaits has found its client
// still waiting; the tests count these rounds instead of sleeping.
var clientChecked = func() {}

// whileClientWaits returns a context that also ends when the client that
// left intent dies or cancels it (plan.Store.CancelIntent): the capture then
// stops CRIU, which lets the source go at once, instead of finishing a plan
// nobody will restore. Podman's checkpoint call cannot be cancelled by its
// client; this is how a ^C of podman container fork reaches the capture.
func (e *Engine) whileClientWaits(ctx context.Context, intent *plan.Intent) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	pidfd := -1
	if intent.Client.Pid != 0 {
		fd, err := unix.PidfdOpen(intent.Client.Pid, 0)
		switch {
		case err != nil || !intent.Client.Running():
			// Gone already (or its PID now names another process).
			if err == nil {
				unix.Close(fd)
			}
			cancel(errClientGone)
			return ctx, func() { cancel(nil) }
		default:
			pidfd = fd
		}
	}
	go func() {
		if pidfd >= 0 {
			defer unix.Close(pidfd)
		}
		for ctx.Err() == nil {
			if e.Store.IntentCancelled(intent) {
				cancel(errClientCancelled)
				return
			}
			clientChecked()
			if pidfd < 0 {
				time.Sleep(clientPoll)
				continue
			}
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, int(clientPoll/time.Millisecond)); n > 0 {
				cancel(errClientGone)
				return
			}
		}
	}()
	// The watch ends by itself within clientPoll; the capture does not wait
	// for it.
	return ctx, func() {
		cancel(nil)
		e.Store.RemoveIntentCancel(intent.ContainerID, intent.Nonce)
	}
}
