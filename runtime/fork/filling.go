package fork

import (
	"context"
	"fmt"
	"time"

	"github.com/tclone/tclone/criuhooks/lazypages"
)

// waitMemoryComplete waits until no task of the source is still receiving
// its memory from a lazy-pages daemon: a source that is itself a sibling
// started lazily. CRIU dumps only the pages that are present, so a capture
// made while some are missing would give its own siblings zeros there. The
// wait is bounded by timeout (the capture timeout); then the fork is
// refused, and the source was not touched.
func waitMemoryComplete(ctx context.Context, src *source, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		filling, err := MemoryFilling(src.state.Pid)
		if err != nil || filling == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s was started with lazy memory and is still receiving it (task %d) after %s: "+
				"a fork now would miss the pages it has not received; fork it again once its memory is complete", src.id, filling, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the memory of %s to be complete: %w", src.id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// MemoryFilling returns a task of the tree under pid that is still
// receiving its memory from a lazy-pages daemon, or 0 when the tree's
// memory is complete. A task that exited meanwhile is not filling.
func MemoryFilling(pid int) (int, error) {
	for _, p := range treePids(pid) {
		filling, err := lazypages.Filling(p)
		if err != nil && processAlive(p) {
			return 0, err
		}
		if filling {
			return p, nil
		}
	}
	return 0, nil
}
