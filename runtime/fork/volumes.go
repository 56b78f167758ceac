package fork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
)

// shmVolume is the name a container's private /dev/shm goes by among the
// volumes a capture copies.
const shmVolume = "/dev/shm"

// volumeToCopy is a volume a capture copies, and where it reads it from.
type volumeToCopy struct {
	forkopts.Volume
	from string
}

// captureVolumes checks the volumes a fork asks to copy against the
// source's mounts, before the source is seized, and adds its private
// /dev/shm: files there that no process maps would otherwise be lost.
func captureVolumes(src *source, asked []forkopts.Volume) ([]volumeToCopy, error) {
	var vols []volumeToCopy
	for _, v := range asked {
		m, ok := bindMountAt(src.spec, v.Destination)
		switch {
		case !ok:
			return nil, fmt.Errorf("volume %s: %s mounts nothing from the host at %s", v.Name, src.id, v.Destination)
		case m.Source != v.Source:
			return nil, fmt.Errorf("volume %s: %s mounts %s at %s, not %s", v.Name, src.id, m.Source, v.Destination, v.Source)
		}
		if st, err := os.Stat(v.Source); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("volume %s: %s is not a directory: only directories are copied into a sibling", v.Name, v.Source)
		}
		vols = append(vols, volumeToCopy{Volume: v, from: v.Source})
	}
	// Podman's private /dev/shm is a tmpfs of the container's own, in its
	// bundle directory, mounted from outside: CRIU dumps none of it. A
	// /dev/shm from anywhere else (the host's, another container's) is
	// shared on purpose, and so is the sibling's.
	// It is read as the container sees it: Podman's own checkpoint
	// unmounts it from the host, leaving an empty directory there.
	if m, ok := bindMountAt(src.spec, shmVolume); ok && within(m.Source, src.state.Bundle) &&
		!slices.ContainsFunc(vols, func(v volumeToCopy) bool { return v.Destination == shmVolume }) {
		vols = append(vols, volumeToCopy{
			Volume: forkopts.Volume{Name: shmVolume, Source: m.Source, Destination: shmVolume},
			from:   fmt.Sprintf("/proc/%d/root%s", src.state.Pid, shmVolume),
		})
	}
	return vols, nil
}

// bindMountAt is the last mount of a host path at dest in spec (a later
// mount hides an earlier one).
func bindMountAt(spec *specs.Spec, dest string) (specs.Mount, bool) {
	for i := len(spec.Mounts) - 1; i >= 0; i-- {
		m := spec.Mounts[i]
		if filepath.Clean(m.Destination) != dest {
			continue
		}
		if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
			return m, true
		}
		return specs.Mount{}, false
	}
	return specs.Mount{}, false
}

// dirWithin reports whether directory dir is root or below it, by
// identity rather than by name: two mounts of one filesystem give one
// directory two names.
func dirWithin(dir, root string) (bool, error) {
	var r unix.Stat_t
	if err := unix.Stat(root, &r); err != nil {
		return false, err
	}
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return false, err
		}
		if st.Dev == r.Dev && st.Ino == r.Ino {
			return true, nil
		}
		if d == "/" {
			return false, nil
		}
	}
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// copyVolumes copies each volume into the plan's volume directory. It runs
// in the source's frozen window, right after the root snapshot, and stops
// when ctx ends; what it copied is removed with the plan.
func copyVolumes(ctx context.Context, vols []volumeToCopy, dir string) ([]plan.Volume, error) {
	if len(vols) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the volume copies' directory: %w", err)
	}
	var out []plan.Volume
	for i, v := range vols {
		if within, err := dirWithin(dir, v.from); err != nil || within {
			return nil, fmt.Errorf("volume %s: tclone's volume copies go to %s, inside the volume itself (%s): the copy would copy itself; keep tclone's snapshot store off the volume's filesystem root (%v)", v.Name, dir, v.from, err)
		}
		t := time.Now()
		snap := filepath.Join(dir, strconv.Itoa(i))
		stats, err := rootfs.CopyDir(ctx, v.from, snap)
		if err != nil {
			return nil, fmt.Errorf("copying volume %s (%s): %w", v.Name, v.from, err)
		}
		out = append(out, plan.Volume{Volume: v.Volume, Snapshot: snap, Stats: stats, CopyMs: ms(time.Since(t))})
	}
	return out, nil
}

// siblingVolume is where a sibling receives a plan's volume copy.
type siblingVolume struct {
	plan.Volume
	target string
}

// siblingVolumes finds, for each volume of the plan, the sibling's own
// directory mounted at the same place, and refuses a sibling that cannot
// take them before anything is made for it: one that does not mount a
// directory there, mounts the source's own (its writes would land in the
// source's volume), or mounts one that holds files (tclone never writes
// over data). /dev/shm is filled only when the sibling's is its own, in
// its bundle; one shared with the source or the host is left alone.
func siblingVolumes(p *plan.Plan, spec *specs.Spec, bundle string) ([]siblingVolume, error) {
	var out []siblingVolume
	for _, v := range p.Volumes {
		m, ok := bindMountAt(spec, v.Destination)
		switch {
		case !ok && v.Name == shmVolume:
			continue
		case !ok:
			return nil, fmt.Errorf("volume %s: the sibling mounts no directory of its own at %s to receive its copy", v.Name, v.Destination)
		case v.Name == shmVolume && (m.Source == v.Source || !within(m.Source, bundle)):
			continue
		case m.Source == v.Source:
			return nil, fmt.Errorf("volume %s: the sibling mounts the source's own %s at %s; give it a directory of its own, or share the volume instead of copying it", v.Name, v.Source, v.Destination)
		}
		empty, err := rootfs.IsEmptyDir(m.Source)
		if err != nil {
			return nil, fmt.Errorf("volume %s: the sibling's %s: %w", v.Name, m.Source, err)
		}
		if !empty {
			return nil, fmt.Errorf("volume %s: the sibling's %s, mounted at %s, is not empty: it receives the copy only when new", v.Name, m.Source, v.Destination)
		}
		out = append(out, siblingVolume{Volume: v, target: m.Source})
	}
	return out, nil
}

// fillVolumes copies the plan's volumes into the sibling's, recording each
// target in the journal first, so that undoing the sibling empties them.
func fillVolumes(entry *journal.Entry, vols []siblingVolume) ([]plan.Volume, error) {
	var out []plan.Volume
	for _, v := range vols {
		// Checked again right before it is recorded: undoing empties a
		// recorded target, which must never hold anyone else's files.
		empty, err := rootfs.IsEmptyDir(v.target)
		if err != nil {
			return nil, fmt.Errorf("volume %s: the sibling's %s: %w", v.Name, v.target, err)
		}
		if !empty {
			return nil, fmt.Errorf("volume %s: the sibling's %s is no longer empty: it receives the copy only when new", v.Name, v.target)
		}
		if err := entry.Update(func(r *journal.Record) {
			r.Materialize.VolumesFilled = append(r.Materialize.VolumesFilled, v.target)
		}); err != nil {
			return nil, err
		}
		t := time.Now()
		stats, err := rootfs.FillDir(v.Snapshot, v.target)
		if err != nil {
			return nil, fmt.Errorf("copying volume %s into the sibling's %s: %w", v.Name, v.target, err)
		}
		out = append(out, plan.Volume{Volume: v.Volume.Volume, Snapshot: v.target, Stats: stats, CopyMs: ms(time.Since(t))})
	}
	return out, nil
}
