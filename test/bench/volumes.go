package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// snapshotRoot is where tclone keeps root filesystem captures and volume
// copies (runtime/plan.DefaultLayout): a copy reflinks only when the
// volume lives on the same filesystem.
const snapshotRoot = "/var/lib/tclone/snapshots"

// VolumeResult is the named-volume experiment: one source with a named
// volume holding SizeMiB of data, forked with the volume shared, copied
// on a filesystem without reflinks, and copied on XFS with reflinks.
type VolumeResult struct {
	SizeMiB  int              `json:"size_mib"`
	Workload string           `json:"workload"`
	Variants []*VolumeVariant `json:"variants"`
}

// VolumeVariant is one way of forking the volume.
type VolumeVariant struct {
	// Name is share, copy or reflink.
	Name string `json:"name"`
	// Mode is the --volume-mode given.
	Mode string `json:"mode"`
	// Filesystem holds the volume and tclone's snapshot store.
	Filesystem  string          `json:"filesystem"`
	NotMeasured string          `json:"not_measured,omitempty"`
	Samples     []*Sample       `json:"samples"`
	Summary     map[string]Stat `json:"summary"`
}

// volumeVariants are measured in this order; share is the pause without a
// copy that the copies are compared with.
var volumeVariants = []struct{ name, mode string }{{"share", "share"}, {"copy", "copy"}, {"reflink", "copy"}}

// runVolumes forks a source with a named volume in each variant: one
// discarded fork, then the configured repetitions.
func (b *Bench) runVolumes(ctx context.Context) *VolumeResult {
	vr := &VolumeResult{SizeMiB: b.cfg.VolumeMiB,
		Workload: fmt.Sprintf("the holder alone (1 process, no memory) with a named volume at /data holding one %d MiB file of random bytes", b.cfg.VolumeMiB)}
	for i, v := range volumeVariants {
		if ctx.Err() != nil {
			break
		}
		vv := &VolumeVariant{Name: v.name, Mode: v.mode}
		vr.Variants = append(vr.Variants, vv)
		prefix := fmt.Sprintf("tcb-%s-vol%d", b.runID, i)
		if err := b.volumeVariant(ctx, vv, prefix); err != nil {
			b.fail("volume-"+v.name, MethodTclone, -1, err)
		}
		vv.Summary = summarizeWarm(vv.Samples)
	}
	return vr
}

// volumeVariant runs one variant: its volume (on a loop XFS mounted under
// tclone's snapshot store too, for reflink), its source, its forks, and
// removes them all.
func (b *Bench) volumeVariant(ctx context.Context, vv *VolumeVariant, prefix string) (err error) {
	volume := prefix + "-data"
	vv.Filesystem = fsType(filepath.Dir(snapshotRoot))
	var volDir string
	if vv.Name == "reflink" {
		dir, undo, err := b.reflinkStore(ctx, prefix)
		if err != nil {
			vv.NotMeasured = err.Error()
			return err
		}
		defer func() { err = errors.Join(err, undo()) }()
		vv.Filesystem = "xfs (loop device, reflink=1)"
		volDir = dir
	}
	if _, _, err := b.tools.podman(ctx, "volume", "create", "--label", "io.tclone.bench="+b.runID, volume); err != nil {
		return fmt.Errorf("creating the volume: %w", err)
	}
	// The source and its siblings go first, then the volume.
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, _, rerr := b.tools.podman(rctx, "volume", "rm", "-f", volume); rerr != nil {
			err = errors.Join(err, fmt.Errorf("removing volume %s: %w", volume, rerr))
		}
	}()
	if volDir != "" {
		// The volume's data directory becomes a directory of the XFS
		// filesystem that also holds the snapshot store: one filesystem,
		// two directories, so the copy can reflink.
		out, _, err := b.tools.podman(ctx, "volume", "inspect", "--format", "{{.Mountpoint}}", volume)
		if err != nil {
			return fmt.Errorf("reading the volume's mount point: %w", err)
		}
		mp := strings.TrimSpace(out)
		if err := unix.Mount(volDir, mp, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", volDir, mp, err)
		}
		defer func() {
			if uerr := unix.Unmount(mp, 0); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unmounting %s: %w", mp, uerr), unix.Unmount(mp, unix.MNT_DETACH))
			}
		}()
	}
	w := holderWorkload(1, 0, "sleep")
	w.Name = "volume-" + vv.Name
	w.RunArgs = []string{"-v", volume + ":/data"}
	src, err := b.startSource(ctx, w, prefix+"-src", "tclone")
	if err != nil {
		b.removeContainers(prefix + "-src")
		return fmt.Errorf("starting the source: %w", err)
	}
	defer b.removeContainers(src.Name)
	if err := fillRandom(filepath.Join(fmt.Sprintf("/proc/%d/root", src.InitPid), "data", "blob"), int64(b.cfg.VolumeMiB)<<20); err != nil {
		return fmt.Errorf("writing the volume's data: %w", err)
	}
	for rep := 0; rep <= b.cfg.VolumeReps && ctx.Err() == nil; rep++ {
		sib := fmt.Sprintf("%s-sib%d", prefix, rep)
		s, err := b.volumeFork(ctx, src, sib, vv.Mode, volume)
		b.removeContainers(sib)
		if err != nil {
			b.fail(w.Name, MethodTclone, rep, err)
			continue
		}
		s.Rep, s.Cold = rep, rep == 0
		vv.Samples = append(vv.Samples, s)
	}
	return nil
}

// volumeFork is one `podman container fork --volume-mode mode` of src.
func (b *Bench) volumeFork(ctx context.Context, src *Source, sib, mode, volume string) (*Sample, error) {
	b.track(sib)
	st, wall, err := b.runPodmanFork(ctx, src, forkRequest{name: sib, count: 1, memory: "copy", volumeMode: mode, stats: true})
	if err != nil {
		return nil, err
	}
	m := map[string]float64{
		"pause_ms":      st.SourcePauseMs,
		"to_running_ms": ms(wall) - st.TotalMs + st.Siblings[0].RunningMs,
		"checkpoint_ms": st.CheckpointMs,
		"restore_ms":    st.Siblings[0].RestoreMs,
		"copy_ms":       0,
		"copied_mib":    0,
		"reflinked_mib": 0,
	}
	found := false
	for _, v := range st.Capture.Volumes {
		if v.Name != volume {
			continue
		}
		found = true
		m["copy_ms"] = v.CopyMs
		m["copied_mib"] = float64(v.Stats.Bytes) / (1 << 20)
		m["reflinked_mib"] = float64(v.Stats.ReflinkedBytes) / (1 << 20)
	}
	if found != (mode == "copy") {
		return nil, fmt.Errorf("--volume-mode %s: the capture copied volume %s: %v, want %v", mode, volume, found, mode == "copy")
	}
	// The sibling's /data holds the file, whichever way it got it.
	if _, _, err := b.tools.podman(ctx, "exec", sib, "test", "-s", "/data/blob"); err != nil {
		return nil, fmt.Errorf("the sibling has no /data/blob: %w", err)
	}
	return &Sample{Sibling: sib, Metrics: m}, nil
}

// reflinkStore makes a loop XFS filesystem with reflinks, bind-mounts a
// directory of it on tclone's snapshot store, and returns another
// directory of it for the volume: a volume copy then shares extents
// instead of copying them. It refuses a store that holds anything or is
// already a mount: other forks' captures live there. The returned undo
// unmounts it all and frees the device.
func (b *Bench) reflinkStore(ctx context.Context, prefix string) (volDir string, undo func() error, err error) {
	if err := os.MkdirAll(snapshotRoot, 0o700); err != nil {
		return "", nil, err
	}
	if ents, err := os.ReadDir(snapshotRoot); err != nil || len(ents) > 0 {
		return "", nil, fmt.Errorf("the reflink variant mounts an XFS directory on %s, which must be empty (it holds %d entries: a fork in progress, or run `tclone gc`): %v", snapshotRoot, len(ents), err)
	}
	if mounted, err := isMountPoint(snapshotRoot); err != nil || mounted {
		return "", nil, fmt.Errorf("%s is already a mount point (an earlier run's? `umount %s` frees it): %v", snapshotRoot, snapshotRoot, err)
	}
	img := filepath.Join(b.tmp, prefix+".xfs")
	mnt := filepath.Join(b.tmp, prefix+".mnt")
	f, err := os.Create(img)
	if err == nil {
		err = errors.Join(f.Truncate(int64(b.cfg.VolumeMiB)<<21+(512<<20)), f.Close(), os.Mkdir(mnt, 0o700))
	}
	if err != nil {
		return "", nil, fmt.Errorf("creating the XFS image: %w", err)
	}
	if _, _, err := runCmd(ctx, "mkfs.xfs", "-q", "-m", "reflink=1", img); err != nil {
		return "", nil, err
	}
	// mount -o loop frees its loop device when unmounted.
	if _, _, err := runCmd(ctx, "mount", "-t", "xfs", "-o", "loop", img, mnt); err != nil {
		return "", nil, err
	}
	unmount := func(path string) error {
		if err := unix.Unmount(path, 0); err != nil {
			// Never leave a directory hidden under the bench's filesystem.
			return errors.Join(fmt.Errorf("unmounting %s: %w; detached it lazily", path, err), unix.Unmount(path, unix.MNT_DETACH))
		}
		return nil
	}
	volDir, snapDir := filepath.Join(mnt, "volume"), filepath.Join(mnt, "snapshots")
	err = errors.Join(os.Mkdir(volDir, 0o755), os.Mkdir(snapDir, 0o700))
	if err == nil {
		err = unix.Mount(snapDir, snapshotRoot, "", unix.MS_BIND, "")
	}
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("mounting the XFS store on %s: %w", snapshotRoot, err), unmount(mnt))
	}
	b.logf("reflink: %s mounted on %s, its volume directory %s", img, snapshotRoot, volDir)
	return volDir, func() error {
		// A sibling's capture is removed with its plan when the fork
		// call ends; give a slow removal a moment before unmounting.
		deadline := time.Now().Add(30 * time.Second)
		for {
			ents, _ := os.ReadDir(snapshotRoot)
			if len(ents) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		return errors.Join(unmount(snapshotRoot), unmount(mnt))
	}, nil
}

func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(path), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// fsType names the filesystem holding path.
func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4 (no reflink)"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// fillRandom writes size bytes of pseudo-random data to path and syncs
// them: a volume's data has no pattern a copy could exploit.
func fillRandom(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	r := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for n := int64(0); n < size; n += int64(len(buf)) {
		r.Read(buf)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(f.Sync(), f.Close())
}
