package fork

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/procfs"
)

// waitMemoryComplete waits until no task of the source is still receiving
// its memory from a lazy-pages daemon: a source that is itself a sibling
// started lazily. CRIU dumps only the pages that are present, so a capture
// made while some are missing would give its own siblings zeros there. The
// wait is bounded by timeout (the capture timeout); then the fork is
// refused, and the source was not touched.
//
// Reading every task's smaps costs about as much as the tree is large, so
// it is skipped when no lazy-pages daemon runs: a task fills only while
// its daemon lives (the daemon's guard kills it when the daemon dies), and
// a daemon's control socket outlives it, never the reverse.
func (e *Engine) waitMemoryComplete(ctx context.Context, src *source, timeout time.Duration) error {
	if socks, _ := filepath.Glob(filepath.Join(e.Store.LazyDir(), "*.sock")); len(socks) == 0 {
		return nil
	}
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

// WaitMemory waits until every task of the sibling m has all of its memory
// (at once for a sibling whose memory was copied) and records when, from the
// start of its materialisation, in m.Timings.MemoryCompleteMs. The wait is
// bounded like a restore (CriuTimeout): a daemon that cannot fill a sibling
// kills it instead, so the bound is only reached on a machine too busy to
// copy its memory.
func (e *Engine) WaitMemory(ctx context.Context, m *Materialized) error {
	st, err := e.Crun.State(ctx, m.ID)
	if err != nil {
		return fmt.Errorf("waiting for the memory of %s: %w", m.ID, err)
	}
	deadline := time.Now().Add(e.criuTimeout())
	for {
		task, err := MemoryFilling(st.Pid)
		if err != nil {
			return fmt.Errorf("waiting for the memory of %s: %w", m.ID, err)
		}
		if task == 0 {
			m.Timings.MemoryCompleteMs = ms(time.Since(m.start))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the memory of %s was not complete after %s: task %d still receives it", m.ID, e.criuTimeout(), task)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the memory of %s: %w", m.ID, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// MemoryFilling returns a task of the tree under pid that is still
// receiving its memory from a lazy-pages daemon, or 0 when the tree's
// memory is complete. A task that exited meanwhile is not filling.
func MemoryFilling(pid int) (int, error) {
	for _, p := range procfs.Tree(pid) {
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
