package fork

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
)

// ForkRequest is `tclone fork SOURCE NEW-ID`: a capture used by exactly one
// sibling.
type ForkRequest struct {
	Source string
	// Fork is the fork's options; its plan serves this one sibling.
	Fork    forkopts.Fork
	Sibling MaterializeRequest
}

// Report is the result of a fork, in the shape `--print-stats` prints.
type Report struct {
	Source  string        `json:"source"`
	Sibling *Materialized `json:"sibling,omitempty"`
	Plan    *plan.Plan    `json:"plan"`
	PlanDir string        `json:"plan_dir"`
	TotalMs float64       `json:"total_ms"`
	// SourcePauseMs repeats Plan.Timings.SourcePauseMs: the number users ask
	// for first.
	SourcePauseMs float64 `json:"source_pause_ms"`
	// MemoryCompleteMs is when, from the start of the fork, the sibling had
	// all of its memory; set by WaitForkMemory.
	MemoryCompleteMs float64 `json:"memory_complete_ms,omitempty"`

	start time.Time
}

// Reported ends the fork once its caller is about to report it done (see
// Materialized.Reported).
func (r *Report) Reported() error { return r.Sibling.Reported() }

// WaitForkMemory waits until the fork's sibling has all of its memory (see
// WaitMemory) and records when in r.MemoryCompleteMs.
func (e *Engine) WaitForkMemory(ctx context.Context, r *Report) error {
	if err := e.WaitMemory(ctx, r.Sibling); err != nil {
		return err
	}
	r.MemoryCompleteMs = ms(r.Sibling.start.Sub(r.start)) + r.Sibling.Timings.MemoryCompleteMs
	return nil
}

// Fork captures source and materialises one sibling from the capture. The
// plan exists only for this call and is gone once the sibling is reported
// (Report.Reported).
func (e *Engine) Fork(ctx context.Context, req ForkRequest) (*Report, error) {
	start := time.Now()
	req.Fork.Uses = 1
	// Everything that can be checked about the source and the sibling is
	// checked before the source is seized for it.
	src, err := e.prepare(ctx, req.Source, &req.Fork, false)
	if err != nil {
		return nil, err
	}
	req.Sibling.Detach = true
	sib, err := e.checkSibling(req.Sibling)
	if err != nil {
		return nil, err
	}
	if req.Fork.TCP == forkopts.TCPKeep {
		srcNetNS, _ := netNSInode(src.state.Pid)
		if err := checkKeepTCP(srcNetNS, sib.spec, req.Sibling.ID); err != nil {
			return nil, err
		}
	}
	c, err := e.captureSource(ctx, src, CaptureRequest{Source: req.Source, Fork: req.Fork})
	if err != nil {
		return nil, err
	}
	mreq := req.Sibling
	mreq.Plan = c.Dir
	mreq.ownsPlan = true
	m, err := e.Materialize(ctx, mreq)
	if err != nil {
		// The failed use went back to the plan; nobody else will use it.
		return nil, errors.Join(err, e.Store.Remove(c.Dir))
	}
	return &Report{
		Source: req.Source, Sibling: m, Plan: c.Plan, PlanDir: c.Dir,
		TotalMs: ms(time.Since(start)), SourcePauseMs: c.Plan.Timings.SourcePauseMs,
		start: start,
	}, nil
}

// PlanDirFor tells whether a restore's --image-path names a fork plan: a
// checkpoint directory holding a reference left by a fork checkpoint, or a
// path inside the plan store (a plan, its images, even one that is gone, so
// that restoring a used-up plan says so instead of reaching crun). It
// returns "" for an ordinary CRIU checkpoint.
func (e *Engine) PlanDirFor(imagePath string) (string, error) {
	if imagePath == "" {
		return "", nil
	}
	abs, err := filepath.Abs(imagePath)
	if err != nil {
		return "", err
	}
	if e.Store.Contains(abs) {
		return e.Store.Resolve(abs)
	}
	ref, err := plan.ReadReference(abs)
	if err != nil || ref == nil {
		return "", err
	}
	// The reference came with an archive anyone could have written: only
	// its plan ID is used, and only a plan of this store is accepted.
	return e.Store.Resolve(ref.PlanID)
}
