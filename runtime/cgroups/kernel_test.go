package cgroups

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// These tests need the kernel: the functions under test find cgroups under
// Root themselves. They make scratch cgroups named tclone-unit-test-* in
// the pids and freezer hierarchies and in cgroup2, move only processes they
// started into them, and remove them after.

// mount is one cgroup filesystem, read from mountinfo independently of the
// code under test.
type mount struct{ point, fstype, options string }

func cgroupMounts(t *testing.T) []mount {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mount
	for s := bufio.NewScanner(f); s.Scan(); {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
		pre, post, _ := strings.Cut(s.Text(), " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) >= 5 && len(b) >= 3 && (b[0] == "cgroup" || b[0] == "cgroup2") {
			out = append(out, mount{point: a[4], fstype: b[0], options: b[2]})
		}
	}
	return out
}

// hierarchy is the mount point of the v1 hierarchy with the controller
// option, or of cgroup2 for "cgroup2"; on a cgroup v2 host, Root.
func hierarchy(t *testing.T, controller string) string {
	t.Helper()
	for _, m := range cgroupMounts(t) {
		if m.point == Root && m.fstype == "cgroup2" {
			return Root
		}
		if controller == "cgroup2" && m.fstype == "cgroup2" ||
			m.fstype == "cgroup" && slices.Contains(strings.Split(m.options, ","), controller) {
			return m.point
		}
	}
	t.Fatalf("no %s cgroup hierarchy is mounted", controller)
	return ""
}

// scratchPath is a cgroup path no one else uses.
func scratchPath() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "/tclone-unit-test-" + hex.EncodeToString(b)
}

// mkcgroup makes the cgroup path (and its parents) in the hierarchy
// mounted at mnt, and removes them after the test (children first, as
// they were made last).
func mkcgroup(t *testing.T, mnt, path string) string {
	t.Helper()
	var made []string
	dir := mnt
	for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); errors.Is(err, os.ErrExist) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		made = append(made, dir)
	}
	t.Cleanup(func() {
		for _, d := range slices.Backward(made) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("removing scratch cgroup %s: %v", d, err)
			}
		}
	})
	return dir
}

func write(t *testing.T, file, value string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		t.Fatal(err)
	}
}

// startIn starts a process that waits on its standard input, and moves it
// into each cgroup directory; it is killed after the test if still there.
func startIn(t *testing.T, dirs ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	for _, d := range dirs {
		write(t, filepath.Join(d, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid))
	}
	return cmd
}

func TestUnified(t *testing.T) {
	want := false
	for _, m := range cgroupMounts(t) {
		if m.point == Root {
			want = m.fstype == "cgroup2"
		}
	}
	if got := Unified(); got != want {
		t.Errorf("Unified() = %v, but %s is mounted cgroup2: %v", got, Root, want)
	}
}

// ProcsDir names a directory of a container's cgroup that lists its
// processes; crun makes the cgroup in every hierarchy, as here in those a
// test may use.
func TestProcsDir(t *testing.T) {
	path := scratchPath()
	var dirs []string
	for _, c := range []string{"pids", "freezer", "cgroup2"} {
		dirs = append(dirs, mkcgroup(t, hierarchy(t, c), path))
	}
	cmd := startIn(t, dirs...)
	got, err := Procs(ProcsDir(path))
	if err != nil || !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("Procs(ProcsDir(%q)) = %v, %v; want the container's process %d", path, got, err, cmd.Process.Pid)
	}
}

// KillAll kills the processes of a cgroup and of its children, and returns
// once they are gone.
func TestKillAll(t *testing.T) {
	path := scratchPath()
	pids := hierarchy(t, "pids")
	parent := mkcgroup(t, pids, path)
	child := mkcgroup(t, pids, path+"/sub")
	a, b := startIn(t, parent), startIn(t, child)
	if err := KillAll(path); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{parent, child} {
		if left, err := Procs(d); err != nil || len(left) > 0 {
			t.Errorf("after KillAll, %s holds %v (%v)", d, left, err)
		}
	}
	for _, cmd := range []*exec.Cmd{a, b} {
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("process %d ended with %v, want SIGKILL", cmd.Process.Pid, err)
		}
	}
	// A cgroup that exists nowhere has nothing to kill.
	if err := KillAll(scratchPath()); err != nil {
		t.Errorf("KillAll of a missing cgroup: %v", err)
	}
}

// HeadroomOf is the least headroom over the cgroup and its ancestors. The
// scratch cgroup has no memory cgroup (tests leave that hierarchy alone),
// so nothing limits its memory.
func TestHeadroomOf(t *testing.T) {
	path := scratchPath()
	pids := hierarchy(t, "pids")
	parent := mkcgroup(t, pids, path)
	child := mkcgroup(t, pids, path+"/sub")
	write(t, filepath.Join(parent, "pids.max"), "10")
	startIn(t, child)
	for childMax, want := range map[string]int{"max": 9, "3": 2, "1": 0} {
		write(t, filepath.Join(child, "pids.max"), childMax)
		h, err := HeadroomOf(path + "/sub")
		if err != nil {
			t.Fatal(err)
		}
		if h.Pids != want || h.MemoryBytes != math.MaxUint64 {
			t.Errorf("parent pids.max 10, child %s, one task: headroom %+v, want %d pids and unlimited memory", childMax, h, want)
		}
	}
	if h, err := HeadroomOf(scratchPath()); err != nil || h.Pids != math.MaxInt || h.MemoryBytes != math.MaxUint64 {
		t.Errorf("headroom of a cgroup that exists nowhere: %+v, %v; want unlimited", h, err)
	}
}

// RemoveLeftovers removes a cgroup path, children first, from every
// hierarchy; one that still holds a process stays, and is reported.
func TestRemoveLeftovers(t *testing.T) {
	path := scratchPath()
	var dirs []string
	for _, c := range []string{"pids", "cgroup2"} {
		mnt := hierarchy(t, c)
		dirs = append(dirs, mkcgroup(t, mnt, path), mkcgroup(t, mnt, path+"/a/b"), mkcgroup(t, mnt, path+"/c"))
	}
	if err := RemoveLeftovers(path); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", d, err)
		}
	}

	busy := mkcgroup(t, hierarchy(t, "pids"), path+"/a")
	startIn(t, busy)
	err := RemoveLeftovers(path)
	if err == nil || !strings.Contains(err.Error(), "removing cgroup "+busy) {
		t.Errorf("RemoveLeftovers of a cgroup holding a process: %v, want an error naming %s", err, busy)
	}
	if _, err := os.Stat(busy); err != nil {
		t.Errorf("the busy cgroup %s was not left: %v", busy, err)
	}
}

// Keepers escape through the hierarchies a whole group is killed or frozen
// by, and never through the memory hierarchy.
func TestKeeperHierarchies(t *testing.T) {
	got, err := keeperHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"pids", "freezer", "cgroup2"} {
		if mnt := hierarchy(t, c); !slices.Contains(got, mnt) {
			t.Errorf("keeper hierarchies %v lack %s's, %s", got, c, mnt)
		}
	}
	if !Unified() && slices.Contains(got, hierarchy(t, "memory")) {
		t.Errorf("keeper hierarchies %v hold the memory hierarchy", got)
	}
}
