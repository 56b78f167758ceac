package criuhooks

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
)

// MarkThawed rewrites the freezer state recorded in a dump's cgroup image to
// THAWED. CRIU records the state it found before the dump; when the caller
// froze the cgroup itself, that is FROZEN, and a restore would start the new
// tree frozen.
func MarkThawed(imagesDir string) error {
	path := filepath.Join(imagesDir, "cgroup.img")
	in, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	img, err := crit.New(in, nil, "", false, false).Decode(&cgroup.CgroupEntry{})
	in.Close()
	if err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	changed := false
	for _, e := range img.Entries {
		ce, ok := e.Message.(*cgroup.CgroupEntry)
		if !ok {
			continue
		}
		for _, ctl := range ce.GetControllers() {
			for _, d := range ctl.GetDirs() {
				changed = thawDir(d) || changed
			}
		}
	}
	if !changed {
		return nil
	}
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := crit.New(nil, out, "", false, false).Encode(img); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func thawDir(d *cgroup.CgroupDirEntry) bool {
	changed := false
	for _, p := range d.GetProperties() {
		if p.GetName() == "freezer.state" && p.GetValue() != "THAWED" {
			v := "THAWED"
			p.Value = &v
			changed = true
		}
	}
	for _, c := range d.GetChildren() {
		changed = thawDir(c) || changed
	}
	return changed
}
