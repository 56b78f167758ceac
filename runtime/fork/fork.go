package fork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/plan"
)

// ForkRequest is `tclone fork SOURCE NEW-ID`: a capture used by exactly one
// sibling.
type ForkRequest struct {
	Source   string
	Capture  CaptureOptions
	Identity plan.Identity
	Sibling  MaterializeRequest
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
}

// Fork captures source and materialises one sibling from the capture. The
// plan exists only for this call and is gone when it returns.
func (e *Engine) Fork(ctx context.Context, req ForkRequest) (*Report, error) {
	start := time.Now()
	c, err := e.Capture(ctx, CaptureRequest{Source: req.Source, Options: req.Capture, Uses: 1, Identity: req.Identity})
	if err != nil {
		return nil, err
	}
	sib := req.Sibling
	sib.Plan = c.Dir
	sib.ownsPlan = true
	m, err := e.Materialize(ctx, sib)
	if err != nil {
		// The failed use went back to the plan; nobody else will use it.
		return nil, errors.Join(err, e.Store.Remove(c.Dir))
	}
	return &Report{
		Source: req.Source, Sibling: m, Plan: c.Plan, PlanDir: c.Dir,
		TotalMs: ms(time.Since(start)), SourcePauseMs: c.Plan.Timings.SourcePauseMs,
	}, nil
}

// PlanDirFor tells whether a restore's --image-path names a fork plan: a
// reference left by a fork checkpoint, a plan directory, or a plan's images
// directory. A path inside the plan store is a plan even when the plan is
// gone (used up or expired), so that restoring it says so instead of handing
// crun a directory that does not exist. It returns "" for an ordinary CRIU
// checkpoint.
func (e *Engine) PlanDirFor(imagePath string) (string, error) {
	if imagePath != "" {
		abs, err := filepath.Abs(imagePath)
		if err != nil {
			return "", err
		}
		if rel, err := filepath.Rel(e.Store.PlansDir(), abs); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			return filepath.Join(e.Store.PlansDir(), strings.Split(rel, string(filepath.Separator))[0]), nil
		}
	}
	ref, err := plan.ReadReference(imagePath)
	if err != nil {
		return "", err
	}
	if ref != nil {
		return ref.PlanDir, nil
	}
	if exists(filepath.Join(imagePath, "plan.json")) {
		return imagePath, nil
	}
	parent := filepath.Dir(filepath.Clean(imagePath))
	if filepath.Base(filepath.Clean(imagePath)) == "images" && exists(filepath.Join(parent, "plan.json")) {
		return parent, nil
	}
	return "", nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
