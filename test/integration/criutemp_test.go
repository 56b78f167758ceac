package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// `tclone gc` removes what a killed CRIU left in /tmp: its mount roots'
// directory, and its kernel probe's directory with the tmpfs and the bind
// mount in it.
func TestGCRemovesDeadCRIUsTemporaries(t *testing.T) {
	requireStack(t)
	probe, err := os.MkdirTemp("/tmp", ".criu.move_mount_set_group.")
	if err != nil {
		t.Fatal(err)
	}
	roots, err := os.MkdirTemp("/tmp", ".criu.mntns.")
	if err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(probe, "subdir")
	t.Cleanup(func() {
		unix.Unmount(sub, unix.MNT_DETACH)
		unix.Unmount(probe, unix.MNT_DETACH)
		os.RemoveAll(probe)
		os.RemoveAll(roots)
	})
	if err := unix.Mount("criu.move_mount_set_group", probe, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(sub, sub, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	// gc leaves them while a CRIU runs (a test before this one may still
	// have one ending): it is asked again until they are gone.
	var removed []string
	eventually(t, 30*time.Second, "gc removed the dead CRIU's directories", func() error {
		removed = append(removed, gcReport(t).CRIUTemps...)
		for _, d := range []string{probe, roots} {
			if !slices.Contains(removed, d) {
				return fmt.Errorf("gc has not reported %s removed (it reported %v)", d, removed)
			}
			if _, err := os.Lstat(d); !os.IsNotExist(err) {
				return fmt.Errorf("%s is still there: %v", d, err)
			}
		}
		return nil
	})
	if mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(probe)); err != nil || len(mounts) != 0 {
		t.Fatalf("mounts left at %s: %d (%v)", probe, len(mounts), err)
	}
}
