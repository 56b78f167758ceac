package lazy

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/branch"
)

// baseImages gives an incremental drain the base branch's images of a
// task (lazypages.Drain's Base): its pagemap and the pages image it names,
// written out of branch store into dir as they are asked for.
type baseImages struct {
	store branch.Store
	id    string
	dir   string

	mu sync.Mutex
	r  *branch.Reader
}

func (b *baseImages) task(pid int32) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.r == nil {
		r, err := b.store.Open(b.id)
		if err != nil {
			return "", fmt.Errorf("the base branch: %w", err)
		}
		b.r = r
		if err := os.MkdirAll(b.dir, 0o700); err != nil {
			return "", err
		}
	}
	pagemap := fmt.Sprintf("pagemap-%d.img", pid)
	if err := b.write(pagemap); err != nil {
		return "", err
	}
	pages, err := lazypages.PagesImageOf(b.dir, pid)
	if err != nil {
		return "", err
	}
	return b.dir, b.write(pages)
}

// write writes the base's image name into dir, unless it is there.
func (b *baseImages) write(name string) error {
	dst := filepath.Join(b.dir, name)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	return b.r.WriteFile(filepath.Join("images", name), dst)
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
	if err != nil || w == nil || w.Base == "" || cfg.Branches == "" {
		return nil, err
	}
	b := &baseImages{store: branch.Store{Dir: cfg.Branches}, id: w.Base, dir: cfg.Images + ".base"}
	d.Writes, d.Base = w, b.task
	return b, nil
}
