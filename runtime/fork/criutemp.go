package fork

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// criuTempPatterns are the temporary directories CRIU 4 makes in the /tmp
// of the mount namespace it runs in, the host's for tclone's CRIU and for
// crun's: its kernel probe of MOVE_MOUNT_SET_GROUP mounts a tmpfs (and a
// bind mount in it) at .criu.move_mount_set_group.*, dumps and restores of
// mounts keep their roots in .criu.mntns.*, and `criu check` mounts in
// .criu.mnt.*. CRIU removes each on its way out; one killed first leaves
// it behind, mounts included.
var criuTempPatterns = []string{".criu.move_mount_set_group.*", ".criu.mntns.*", ".criu.mnt.*"}

// criuTempDir is where CRIU makes them: /tmp, whatever TMPDIR says.
const criuTempDir = "/tmp"

// CRIUTempGlobs are the globs of what a killed CRIU leaves in the host's
// /tmp, which `tclone gc` removes.
func CRIUTempGlobs() []string {
	var out []string
	for _, p := range criuTempPatterns {
		out = append(out, filepath.Join(criuTempDir, p))
	}
	return out
}

// errForeignMount is a mount CRIU does not make, found in one of its
// directories: it is left, with the directory.
var errForeignMount = errors.New("something CRIU does not mount is mounted there")

// sweepCRIUTemps removes what killed CRIUs left in tmp (see
// criuTempPatterns), unmounting what is mounted there first. It does
// nothing while any CRIU runs (running, criuRunning but in tests): the
// directories are listed first and only then is every process looked at,
// so a directory removed was made by a CRIU that had died (one that starts
// later makes new names). A directory with a mount that would not go is
// left. Returns the directories removed.
func sweepCRIUTemps(tmp string, running func() (bool, error)) ([]string, error) {
	tmp, err := filepath.EvalSymlinks(tmp)
	if err != nil {
		return nil, err
	}
	var listed []string
	for _, p := range criuTempPatterns {
		m, err := filepath.Glob(filepath.Join(tmp, p))
		if err != nil {
			return nil, err
		}
		listed = append(listed, m...)
	}
	if len(listed) == 0 {
		return nil, nil
	}
	if busy, err := running(); err != nil || busy {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, dir := range listed {
		// CRIU runs as root here: what root does not own is not a CRIU's.
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			continue
		}
		// Only the mounts CRIU's probe makes, the tmpfs at the directory
		// and the bind mount of its "subdir", are taken down, by paths no
		// one but root can change (root's entries in /tmp and in that
		// tmpfs, both sticky): anything else mounted there may sit at a
		// path another user could swap for a symlink to some other mount.
		if err := unmountUnder(dir); errors.Is(err, errForeignMount) {
			logrus.Warnf("leaving %s: a dead CRIU's directory, but %v", dir, err)
			continue
		} else if err != nil {
			errs = append(errs, fmt.Errorf("unmounting what a dead CRIU left at %s: %w (unmount it by hand, then run tclone gc again)", dir, err))
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing what a dead CRIU left at %s: %w (remove it by hand)", dir, err))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// probeMountsOnly says whether every mount in mounted (none included) is
// one CRIU's MOVE_MOUNT_SET_GROUP probe makes in dir.
func probeMountsOnly(dir string, mounted []*mountinfo.Info) bool {
	probe := strings.HasPrefix(filepath.Base(dir), ".criu.move_mount_set_group.")
	for _, m := range mounted {
		if !probe || m.Mountpoint != dir && m.Mountpoint != filepath.Join(dir, "subdir") {
			return false
		}
	}
	return true
}

// criuRunning tells whether any live process on the host is named criu (a
// zombie holds nothing any more).
func criuRunning() (bool, error) {
	pids, err := procfs.Pids()
	if err != nil {
		return false, err
	}
	for _, pid := range pids {
		if st, err := procfs.ReadStat(pid); err == nil && st.Comm == "criu" && !st.Exited() {
			return true, nil
		}
	}
	return false, nil
}

// unmountUnder detaches the probe's mounts at dir and below it, the deepest
// first, and checks that none is left: RemoveAll must never walk into a
// mount. Another mount there fails it with errForeignMount, before it
// takes down anything.
func unmountUnder(dir string) error {
	under := func() ([]string, error) {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		if err != nil {
			return nil, err
		}
		if !probeMountsOnly(dir, mounts) {
			return nil, errForeignMount
		}
		var points []string
		for _, m := range mounts {
			points = append(points, m.Mountpoint)
		}
		// The deepest first, and each once (mounts stacked on one point
		// are detached one call at a time).
		slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		return points, nil
	}
	for try := 0; try < 8; try++ {
		points, err := under()
		if err != nil || len(points) == 0 {
			return err
		}
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
	}
	return fmt.Errorf("mounts are still there after 8 rounds of unmounting")
}
