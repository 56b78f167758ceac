// Package fork is tclone's engine: it captures a running container into a
// fork plan (Phase A) and materialises siblings from a plan (Phase B), and it
// recovers from operations that a crash left half done.
package fork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
)

const (
	dumpLogName    = "dump.log"
	restoreLogName = "restore.log"
	// descriptorsFile is crun's record of a container's original stdio; its
	// restore reconnects those pipes to the caller's.
	descriptorsFile = "descriptors.json"
)

// DefaultCriuTimeout bounds every CRIU restore.
const DefaultCriuTimeout = 5 * time.Minute

// Engine runs fork operations.
type Engine struct {
	Crun    *crun.Runtime
	Store   plan.Store
	Journal journal.Journal
	// CriuTimeout bounds each CRIU restore. (A capture's bound is among
	// its options: forkopts.Fork.CaptureTimeout.)
	CriuTimeout time.Duration
}

// NewEngine returns an engine with tclone's default store and journal.
func NewEngine(rt *crun.Runtime) *Engine {
	store := plan.DefaultStore()
	return &Engine{
		Crun:        rt,
		Store:       store,
		Journal:     journal.Journal{Dir: filepath.Join(store.Root, "journal")},
		CriuTimeout: DefaultCriuTimeout,
	}
}

func (e *Engine) criuTimeout() time.Duration {
	if e.CriuTimeout > 0 {
		return e.CriuTimeout
	}
	return DefaultCriuTimeout
}

// lockSource serialises captures of one container: CRIU cannot seize a tree
// that another CRIU holds, so concurrent forks of one source queue here and
// each succeeds in turn.
func (e *Engine) lockSource(ctx context.Context, id string) (func(), error) {
	// A context that is already done still takes a free lock: recovery
	// uses one to try the lock without waiting.
	unlock, err := plan.Lock(ctx, filepath.Join(e.Store.LocksDir(), id+".lock"))
	switch {
	case err == nil:
		return unlock, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for another capture of %s to finish: %w", id, ctx.Err())
	}
	return nil, fmt.Errorf("locking source %s: %w", id, err)
}

// LogDir keeps the CRIU logs of failed operations, whose work directories
// are removed with everything else the failure left.
var LogDir = "/var/log/tclone"

// keepLog copies a CRIU log of a failed operation to LogDir and returns
// where it is now ("" if it could not be kept).
func keepLog(path, op, id string) string {
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	if err := os.MkdirAll(LogDir, 0o700); err != nil {
		return ""
	}
	dst := filepath.Join(LogDir, fmt.Sprintf("%s-%s-%s.log", op, id, time.Now().UTC().Format("20060102T150405.000")))
	if err := copyFile(path, dst); err != nil {
		return ""
	}
	return dst
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// lazyPaths names the files of plan id's lazy-pages daemon.
func (e *Engine) lazyPaths(id string) lazy.Paths {
	return lazy.PathsFor(lazy.Dir(e.Store.Root), lazy.ImagesDir(e.Store.PlansDir()), LogDir, id)
}
