package criuhooks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/tty"
	"google.golang.org/protobuf/proto"
)

// FixupDump corrects what CRIU records at a fork's dump that would make a
// restored sibling behave differently from its running source. It runs once
// per plan, after the source is running again.
func FixupDump(imagesDir string) error {
	return errors.Join(markThawed(imagesDir), rearmTimerfds(imagesDir), giveBackForeground(imagesDir))
}

// markThawed rewrites the freezer state recorded in the cgroup image to
// THAWED. CRIU records the state it found, and tclone freezes the cgroup
// before CRIU looks: left as FROZEN, every sibling would start frozen.
func markThawed(imagesDir string) error {
	return rewriteImage(filepath.Join(imagesDir, "cgroup.img"), &cgroup.CgroupEntry{}, func(m proto.Message) bool {
		changed := false
		for _, ctl := range m.(*cgroup.CgroupEntry).GetControllers() {
			for _, d := range ctl.GetDirs() {
				changed = thawDir(d) || changed
			}
		}
		return changed
	})
}

func thawDir(d *cgroup.CgroupDirEntry) bool {
	changed := false
	for _, p := range d.GetProperties() {
		if p.GetName() == "freezer.state" && p.GetValue() != "THAWED" {
			p.Value = proto.String("THAWED")
			changed = true
		}
	}
	for _, c := range d.GetChildren() {
		changed = thawDir(c) || changed
	}
	return changed
}

// rearmTimerfds fixes periodic timerfds that CRIU would restore disarmed.
// While the source is frozen, a periodic timerfd whose expiry went unread
// reports no time left until the next one; CRIU stores that zero, and a
// timerfd restored with a zero value is switched off, so the sibling's
// reader takes the stored ticks and then blocks for ever. A periodic timer
// never has "no next expiry": it is re-armed one interval ahead.
func rearmTimerfds(imagesDir string) error {
	return rewriteImage(filepath.Join(imagesDir, "files.img"), &fdinfo.FileEntry{}, func(m proto.Message) bool {
		t := m.(*fdinfo.FileEntry).GetTfd()
		if t == nil || t.GetVsec() != 0 || t.GetVnsec() != 0 || (t.GetIsec() == 0 && t.GetInsec() == 0) {
			return false
		}
		t.Vsec, t.Vnsec = proto.Uint64(t.GetIsec()), proto.Uint64(t.GetInsec())
		return true
	})
}

// giveBackForeground hands a terminal whose foreground process group has no
// process left to its session leader. A shell's terminal is in that state
// between reaping a foreground job and taking the terminal back; CRIU records
// the empty group as it is, and then fails the restore, because a terminal's
// foreground can only be given to a group that exists ("Failed to set group
// N": No such process). The session leader is the one the foreground goes
// back to in the source too, an instant later.
func giveBackForeground(imagesDir string) error {
	tree, err := decodeImage(filepath.Join(imagesDir, "pstree.img"), &pstree.PstreeEntry{})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	groups, leaders := map[uint32]bool{}, map[uint32]bool{}
	for _, e := range tree.Entries {
		if p, ok := e.Message.(*pstree.PstreeEntry); ok {
			groups[p.GetPgid()] = true
			leaders[p.GetSid()] = leaders[p.GetSid()] || p.GetPid() == p.GetSid()
		}
	}
	return rewriteImage(filepath.Join(imagesDir, "tty-info.img"), &tty.TtyInfoEntry{}, func(m proto.Message) bool {
		t := m.(*tty.TtyInfoEntry)
		// A session whose leader is not in the images (a shell job's) is
		// CRIU's to handle.
		if t.GetPgrp() == 0 || groups[t.GetPgrp()] || !leaders[t.GetSid()] {
			return false
		}
		t.Pgrp = proto.Uint32(t.GetSid())
		return true
	})
}

// rewriteImage applies edit to every entry of a CRIU image and writes the
// image back, atomically, if any entry changed. A missing image is not an
// error: not every dump has every image.
func rewriteImage(path string, entryType proto.Message, edit func(proto.Message) bool) error {
	img, err := decodeImage(path, entryType)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	changed := false
	for _, e := range img.Entries {
		if e.Message != nil && edit(e.Message) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	tmp := path + ".tmp"
	if err := encodeImage(img, tmp, os.O_TRUNC); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// decodeImage reads a CRIU image whose entries are of entryType.
func decodeImage(path string, entryType proto.Message) (*crit.CriuImage, error) {
	in, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(entryType)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return img, nil
}

// encodeImage writes img to a new file at path, created with flag
// (os.O_EXCL or os.O_TRUNC).
func encodeImage(img *crit.CriuImage, path string, flag int) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, 0o600)
	if err != nil {
		return err
	}
	if err := crit.New(nil, out, "", false, false).Encode(img); err != nil {
		out.Close()
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return out.Close()
}

// ImageTasks lists the processes of the dump in imagesDir that have
// memory in it (an mm image: a zombie has none), by the pids the images
// give them.
func ImageTasks(imagesDir string) ([]int32, error) {
	tree, err := decodeImage(filepath.Join(imagesDir, "pstree.img"), &pstree.PstreeEntry{})
	if err != nil {
		return nil, err
	}
	var pids []int32
	for _, e := range tree.Entries {
		p, ok := e.Message.(*pstree.PstreeEntry)
		if !ok {
			continue
		}
		pid := int32(p.GetPid())
		if _, err := os.Stat(filepath.Join(imagesDir, fmt.Sprintf("mm-%d.img", pid))); errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
