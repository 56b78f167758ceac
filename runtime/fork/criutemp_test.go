package fork

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/test/testenv"
)

// What killed CRIUs left in /tmp goes, mounts first, but only while no
// CRIU runs; nothing else there is touched.
func TestSweepCRIUTemps(t *testing.T) {
	testenv.NeedRoot(t, "mounts a tmpfs where a killed CRIU's probe left one")
	tmp := t.TempDir()
	probe := filepath.Join(tmp, ".criu.move_mount_set_group.AbC123")
	roots := filepath.Join(tmp, ".criu.mntns.XyZ789")
	other := filepath.Join(tmp, ".criu.kept")
	// Not CRIU's: another user's, and one with a mount CRIU does not make.
	users := filepath.Join(tmp, ".criu.mntns.user01")
	open := filepath.Join(tmp, ".criu.mntns.open01")
	for _, d := range []string{probe, roots, filepath.Join(roots, "mnt-0000000042"), other, users, filepath.Join(open, "m")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(users, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("other", filepath.Join(open, "m"), "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(open, "m"), unix.MNT_DETACH) })
	// As CRIU's probe does: a tmpfs, a directory in it bind-mounted on
	// itself, and a file that must go with the tmpfs, not by RemoveAll.
	if err := unix.Mount("criu.move_mount_set_group", probe, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(probe, unix.MNT_DETACH) })
	sub := filepath.Join(probe, "subdir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(sub, sub, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })

	// A CRIU at work: nothing is removed.
	bin := filepath.Join(t.TempDir(), "criu")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o700); err != nil {
		t.Fatal(err)
	}
	criu := exec.Command(bin, "60")
	if err := criu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { criu.Process.Kill(); criu.Wait() })
	removed, err := sweepCRIUTemps(tmp, criuRunning)
	if err != nil || len(removed) != 0 {
		t.Fatalf("while a CRIU runs: removed %v (%v), want nothing", removed, err)
	}
	if mounted, err := mountinfo.Mounted(probe); err != nil || !mounted {
		t.Fatalf("the probe's tmpfs went while a CRIU runs: %v %v", mounted, err)
	}

	// It died: both go, the kept directory stays. (Other tests may run
	// CRIU meanwhile, so from here no CRIU is said to run.)
	criu.Process.Kill()
	criu.Wait()
	none := func() (bool, error) { return false, nil }
	removed, err = sweepCRIUTemps(tmp, none)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{roots, probe}; !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, d := range []string{probe, roots} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", d, err)
		}
	}
	if mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(probe)); len(mounts) != 0 {
		t.Errorf("mounts left under %s: %v", probe, mounts[0].Mountpoint)
	}
	for _, d := range []string{other, users} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was touched: %v", d, err)
		}
	}
	if mounted, err := mountinfo.Mounted(filepath.Join(open, "m")); err != nil || !mounted {
		t.Errorf("the mount in a directory others may write to was touched: %v %v", mounted, err)
	}
	if removed, err := sweepCRIUTemps(tmp, none); err != nil || len(removed) != 0 {
		t.Errorf("a second sweep: %v %v", removed, err)
	}
}
