package fork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/internal/copyfile"
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
	Crun *crun.Runtime
	// Store is tclone's state on the host; its Layout names every path
	// the engine uses.
	Store plan.Store
	// CriuTimeout bounds each CRIU restore. (A capture's bound is among
	// its options: forkopts.Fork.CaptureTimeout.)
	CriuTimeout time.Duration
}

// NewEngine returns an engine on the store of layout.
func NewEngine(rt *crun.Runtime, layout plan.Layout) *Engine {
	return &Engine{
		Crun:        rt,
		Store:       plan.Store{Layout: layout},
		CriuTimeout: DefaultCriuTimeout,
	}
}

// journal records the engine's operations in flight.
func (e *Engine) journal() journal.Journal { return journal.Journal{Dir: e.Store.JournalDir()} }

// CheckCriu verifies the CRIU the engine will use (criucheck), cached in
// the store.
func (e *Engine) CheckCriu(ctx context.Context) (*criucheck.Result, error) {
	return criucheck.Check(ctx, e.Store.CriuCheckFile())
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

// keepLog copies a CRIU log of a failed operation to the layout's LogDir
// and returns where it is now ("" if it could not be kept).
func (e *Engine) keepLog(path, op, id string) string {
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	if err := os.MkdirAll(e.Store.LogDir, 0o700); err != nil {
		return ""
	}
	dst := filepath.Join(e.Store.LogDir, fmt.Sprintf("%s-%s-%s.log", op, id, logTime()))
	if err := copyfile.Copy(path, dst, os.O_TRUNC); err != nil {
		return ""
	}
	return dst
}

// logTime stamps the name of a log file.
func logTime() string { return time.Now().UTC().Format("20060102T150405.000") }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// lazyPaths names the files of plan id's lazy-pages daemon.
func (e *Engine) lazyPaths(id string) lazy.Paths {
	return lazy.PathsFor(e.Store.Layout, id)
}
