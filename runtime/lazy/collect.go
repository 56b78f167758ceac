package lazy

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/plan"
)

// Collect removes what daemons that died left in layout l's lazy and lazy
// images directories: their image links, control sockets and lock files. A
// daemon that answers is left alone. One that does not may be dying: its
// guard shares its lock and exits after it, which takes as long as the
// kernel takes to tear the daemon down. So its lock is waited for, up to
// collectLockWait; a lock still held then (a daemon starting or stopping)
// leaves it alone. It returns the plan IDs it cleaned up after.
func Collect(l plan.Layout) ([]string, error) {
	dir, imagesDir := l.LazyDir(), l.LazyImagesDir()
	seen := map[string]bool{}
	for _, d := range []string{dir, imagesDir} {
		entries, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			name := e.Name()
			if d == imagesDir {
				seen[name] = true
				continue
			}
			for _, suffix := range []string{".sock", ".lock", ".twins.json"} {
				if id, ok := strings.CutSuffix(name, suffix); ok {
					seen[id] = true
				}
			}
		}
	}
	var removed []string
	var errs []error
	for id := range seen {
		p := PathsFor(l, id)
		if c, err := dial(p.Control); err == nil {
			c.Close()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), collectLockWait)
		unlock, err := plan.Lock(ctx, p.Lock)
		cancel()
		if err != nil {
			continue
		}
		if c, err := dial(p.Control); err == nil {
			c.Close()
			unlock()
			continue
		}
		// Its twins died with their last lifeline; their zombies wait.
		if err := collectTwins(p); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, os.RemoveAll(p.Images), ignoreMissing(os.Remove(p.Control)), ignoreMissing(os.Remove(p.Lock)))
		unlock()
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// collectLockWait bounds how long Collect waits for a silent daemon's lock.
var collectLockWait = 5 * time.Second

func ignoreMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
