package lazy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/tclone/tclone/runtime/plan"
)

// Collect removes what daemons that died left in dir (the store's lazy
// directory) and imagesDir: their image links, control sockets and lock
// files. A daemon that answers, or whose lock is held (it is starting or
// stopping), is left alone. It returns the plan IDs it cleaned up after.
func Collect(dir, imagesDir, logDir string) ([]string, error) {
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
			for _, suffix := range []string{".sock", ".lock"} {
				if id, ok := strings.CutSuffix(name, suffix); ok {
					seen[id] = true
				}
			}
		}
	}
	var removed []string
	var errs []error
	for id := range seen {
		p := PathsFor(dir, imagesDir, logDir, id)
		done, cancel := context.WithCancel(context.Background())
		cancel() // take the lock only if it is free
		unlock, err := plan.Lock(done, p.Lock)
		if err != nil {
			continue
		}
		if c, err := dial(p.Control); err == nil {
			c.Close()
			unlock()
			continue
		}
		errs = append(errs, os.RemoveAll(p.Images), ignoreMissing(os.Remove(p.Control)), ignoreMissing(os.Remove(p.Lock)))
		unlock()
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

func ignoreMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Dir is the lazy directory of a store rooted at root.
func Dir(root string) string { return filepath.Join(root, "lazy") }

// ImagesDir is where daemons of a store whose plans are in plansDir keep
// their image links: on the plans' tmpfs.
func ImagesDir(plansDir string) string { return filepath.Join(plansDir, ".lazy") }
