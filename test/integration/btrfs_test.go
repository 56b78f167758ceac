package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// btrfsScratch makes a small btrfs filesystem on a loop device for the test.
func btrfsScratch(t *testing.T) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "btrfs.img")
	mnt := t.TempDir()
	steps := [][]string{
		{"truncate", "-s", "512M", img},
		{"mkfs.btrfs", "-q", img},
		{"mount", "-o", "loop", img, mnt},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", s, err, out)
		}
	}
	t.Cleanup(func() {
		// Containers first (their cleanups registered later run first),
		// then every subvolume, then the filesystem.
		exec.Command("umount", "-l", mnt).Run()
	})
	return mnt
}

// A source whose root is a btrfs subvolume is captured by a subvolume
// snapshot, and a sibling on the same filesystem gets a writable snapshot of
// it: no file is copied.
func TestForkBtrfsRoot(t *testing.T) {
	requireStack(t)
	fs := btrfsScratch(t)
	src := newBundle(t, "src", false, "sh", "-c", "echo before > /tmp/marker; "+counterScript)
	sib := newBundle(t, "sib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	// Both roots on the btrfs: the source's a subvolume with busybox.
	src.spec.Root.Path = filepath.Join(fs, "src-root")
	sib.spec.Root.Path = filepath.Join(fs, "sib-root")
	src.save(t)
	sib.save(t)
	if out, err := exec.Command("btrfs", "subvolume", "create", src.spec.Root.Path).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := exec.Command("cp", "-a", busyboxRootfs(t)+"/.", src.spec.Root.Path).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	os.Mkdir(sib.spec.Root.Path, 0o755)
	t.Cleanup(func() {
		exec.Command("crun", "delete", "--force", sib.id).Run()
		exec.Command("crun", "delete", "--force", src.id).Run()
		for _, p := range []string{sib.spec.Root.Path, src.spec.Root.Path} {
			exec.Command("btrfs", "subvolume", "delete", p).Run()
		}
	})
	src.start(t)
	src.counter(t)

	r := forkBundle(t, src, sib, nil, "--print-stats")
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	var report struct {
		Plan struct {
			Rootfs struct {
				Kind  string
				Stats struct{ Bytes int64 }
			}
		}
		Sibling struct{ Rootfs struct{ Bytes int64 } }
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatal(err)
	}
	if report.Plan.Rootfs.Kind != "btrfs" || report.Plan.Rootfs.Stats.Bytes != 0 || report.Sibling.Rootfs.Bytes != 0 {
		t.Fatalf("btrfs root captured as %+v", report)
	}
	out, err := exec.Command("btrfs", "subvolume", "show", sib.spec.Root.Path).CombinedOutput()
	if err != nil {
		t.Fatalf("the sibling's root is not a subvolume: %s", out)
	}
	if m := sib.mustExec(t, "cat", "/tmp/marker"); m != "before" {
		t.Fatalf("sibling marker %q", m)
	}
	sib.mustExec(t, "sh", "-c", "echo sibling > /tmp/marker")
	if m := src.mustExec(t, "cat", "/tmp/marker"); m != "before" {
		t.Fatalf("a sibling write reached the source: %q", m)
	}
	a := sib.counter(t)
	time.Sleep(500 * time.Millisecond)
	if b := sib.counter(t); b <= a {
		t.Fatal("sibling counter stuck")
	}
	requireRunning(t, src)
	requireNoLeftovers(t)
	// The capture's read-only snapshot went with the plan.
	if snaps, _ := filepath.Glob(filepath.Join(fs, ".tclone-*")); len(snaps) != 0 {
		t.Fatalf("btrfs snapshots left: %v", snaps)
	}

	// A plan lost with the tmpfs store (a reboot) leaves its btrfs snapshot
	// beside the subvolume; tclone gc still finds and removes it.
	r = run(t, time.Minute, tcloneBin(), "fork", "--plan-only", src.id)
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	if snaps, _ := filepath.Glob(filepath.Join(fs, ".tclone-*")); len(snaps) != 1 {
		t.Fatalf("btrfs snapshots after a capture: %v", snaps)
	}
	if err := os.RemoveAll(planDir); err != nil {
		t.Fatal(err)
	}
	if g := run(t, time.Minute, tcloneBin(), "gc"); g.code != 0 {
		t.Fatalf("gc: %s", g.stderr)
	}
	if snaps, _ := filepath.Glob(filepath.Join(fs, ".tclone-*")); len(snaps) != 0 {
		t.Fatalf("gc left the snapshot of a lost plan: %v", snaps)
	}
	requireNoLeftovers(t)
}
