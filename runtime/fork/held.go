package fork

import (
	"context"
	"fmt"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"

	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
)

// heldMemory is a capture's memory that the plan's lazy-pages daemon will
// hold instead of page images (forkopts.Memory.Held): the module's
// snapshots (cowCapture) or twins (twinCapture).
type heldMemory interface {
	// begin makes opts, whose work directory is workDir, the dump this
	// memory needs, with the CRIU options in conf too (lines of CRIU's
	// configuration file, which only tclone's build of CRIU takes).
	begin(opts *rpc.CriuOpts, workDir string, conf []string) (dumpSetup, error)
	// take takes the memory of the tree whose root has host pid root,
	// which CRIU holds (post-dump).
	take(root int) error
	// adopt finishes the taking once CRIU has returned and the tree
	// runs again, with what need not be in the source's pause.
	adopt(root int) error
	// dumpErr says why the dump failed, where the memory knows better
	// than CRIU's log.
	dumpErr() error
	// dumpDone ends what the dump needed; what take took stays.
	dumpDone()
	// taken says whether take succeeded; held is then what it took.
	taken() bool
	held() lazy.Held
	// handed: the plan's daemon holds the memory now.
	handed()
	// release lets go of everything this process holds.
	release()
}

// dumpSetup is what a heldMemory asks of the CRIU that dumps.
type dumpSetup struct {
	// env is added to CRIU's environment; criuPath, if set, is the criu
	// to run.
	env      []string
	criuPath string
	// started, if set, runs once CRIU has started.
	started func()
}

// holdSnapshots hands the capture's memory to the plan's daemon, started
// for it, and records it in the plan.
func (op *captureOp) holdSnapshots(ctx context.Context, p *plan.Plan) error {
	h := op.held
	defer h.release()
	start := time.Now()
	held := h.held()
	held.SourceCgroup = op.src.status.CgroupPath
	pid, err := lazy.Hold(ctx, op.e.lazyPaths(op.id), op.dir, p.ExpiresAt, held)
	if err != nil {
		return fmt.Errorf("handing the source's memory to the plan's lazy-pages daemon: %w", err)
	}
	h.handed()
	s := held.Snapshots
	p.Snapshots = &plan.Snapshots{
		Processes: len(s.Files), AnonPages: s.AnonPages, SwapEntries: s.SwapEntries,
		TookMs: ms(s.Took), HolderPid: pid, Twins: len(held.Twins),
	}
	op.log.phase("snapshots", map[string]any{"processes": p.Snapshots.Processes, "twins": len(held.Twins),
		"anon_pages": s.AnonPages, "took_ms": p.Snapshots.TookMs, "holder": pid, "hand_over_ms": ms(time.Since(start))})
	return nil
}
