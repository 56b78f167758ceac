package lazy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/branch"
)

// baseImages gives an incremental drain the base branch's images of a
// task (lazypages.Drain's Base): its pagemap, written out of the branch
// store into dir, and the pages image it names, read where the store keeps
// it.
type baseImages struct {
	store branch.Store
	id    string
	dir   string

	mu sync.Mutex
	r  *branch.Reader
}

func (b *baseImages) task(pid int32) (*lazypages.BaseTask, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.r == nil {
		r, err := b.store.Open(b.id)
		if err != nil {
			return nil, fmt.Errorf("the base branch: %w", err)
		}
		b.r = r
		if err := os.MkdirAll(b.dir, 0o700); err != nil {
			return nil, err
		}
	}
	pagemap := filepath.Join(b.dir, fmt.Sprintf("pagemap-%d.img", pid))
	if _, err := os.Stat(pagemap); err != nil {
		err := b.r.WriteFile(filepath.Join("images", filepath.Base(pagemap)), pagemap)
		if errors.Is(err, branch.ErrNoFile) {
			return nil, nil // a process that came after the base
		}
		if err != nil {
			return nil, err
		}
	}
	pages, err := lazypages.PagesImageOf(pagemap)
	if err != nil {
		return nil, err
	}
	fr, err := b.r.OpenFile(filepath.Join("images", pages))
	if err != nil {
		return nil, err
	}
	return &lazypages.BaseTask{Pagemap: pagemap, Pages: fr}, nil
}

// close lets go of the branch and removes what was written.
func (b *baseImages) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.r != nil {
		b.r.Close()
		b.r = nil
	}
	os.RemoveAll(b.dir)
}

// incremental makes d an incremental drain where the plan's capture
// tracked its source's writes against a base branch; the base's images it
// returns are the caller's to close once the drain is over.
func incremental(d *lazypages.Drain, cfg daemonConfig) (*baseImages, error) {
	w, err := lazypages.ReadWrites(cfg.PlanImages)
	if err != nil {
		// The drain copies every page from the twins, as without it.
		logrus.Warnf("incremental drain: %v (every page is copied from the twins)", err)
		return nil, nil
	}
	if w == nil || w.Base == "" || cfg.Branches == "" {
		return nil, nil
	}
	// Inside the daemon's own images directory, which tclone gc removes
	// only with the daemon.
	b := &baseImages{store: branch.Store{Dir: cfg.Branches}, id: w.Base, dir: filepath.Join(cfg.Images, ".base")}
	d.Writes, d.Base = w, b.task
	return b, nil
}
