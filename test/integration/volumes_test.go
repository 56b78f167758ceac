package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// volume makes a named volume for the test. Make it before the containers
// that use it: it is removed after them (cleanups run last first), and
// never by force, which would remove any container still using it.
func volume(t *testing.T, prefix string) string {
	t.Helper()
	v := uniqueName(prefix)
	podman(t, "volume", "create", v)
	t.Cleanup(func() {
		if r := podmanTry(t, "volume", "rm", v); r.code != 0 {
			t.Errorf("removing volume %s: %s", v, r.stderr)
		}
	})
	return v
}

func volumeNames(t *testing.T) []string {
	t.Helper()
	return strings.Fields(podman(t, "volume", "ls", "-q"))
}

// Every sibling gets its own copy of a named volume by default, holding the
// volume as it was at the fork instant (consistent with the root
// filesystem, captured in the same frozen window); writes after the fork
// stay on their side; the source's private /dev/shm comes along; a host
// directory mounted by path stays shared and is reported so; `podman rm -v`
// of a sibling removes its copy and never the source's volume.
func TestPodmanForkNamedVolume(t *testing.T) {
	requireStack(t)
	vol := volume(t, "vol")
	host := t.TempDir()
	src := name(t, "vsrc")
	// The loop writes the same number to the volume and to the root
	// filesystem, and stops for good once its hostname changes (in the
	// sibling), before writing again: the sibling's two files are what the
	// capture took.
	loop := `echo pre-fork > /data/pre; echo shm-file > /dev/shm/unmapped; H=$(hostname); i=0; ` +
		`while [ "$(hostname)" = "$H" ]; do i=$((i+1)); echo $i > /data/c; echo $i > /tmp/c; sleep 0.01; done; exec sleep 100000`
	podman(t, "run", "-d", "--name", src, "-v", vol+":/data", "-v", host+":/host", busybox, "sh", "-c", loop)
	eventually(t, 10*time.Second, "source writing", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/data/c"); r.code != 0 || strings.TrimSpace(r.stdout) == "" {
			return errorf("no counter yet: %s", r.stderr)
		}
		return nil
	})
	before := volumeNames(t)

	r := forkCLI(t, "--print-stats", src)
	if r.code != 0 {
		t.Fatalf("fork of a container with a named volume: %s", r.stderr)
	}
	var st struct {
		Capture struct {
			Volumes []struct {
				Name   string
				CopyMs float64 `json:"copy_ms"`
				Stats  struct{ Files int }
			}
		}
		Siblings []struct {
			Name    string
			Volumes []struct {
				Name, Source, Destination, Mode, Copy string
			}
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("--print-stats: %v %q", err, r.stdout)
	}
	sib := st.Siblings[0].Name
	wantCopy := vol + "-" + sib
	var sawCopy, sawBind bool
	for _, v := range st.Siblings[0].Volumes {
		switch {
		case v.Name == vol && v.Mode == "copy" && v.Copy == wantCopy && v.Destination == "/data":
			sawCopy = true
		case v.Name == "" && v.Mode == "bind" && v.Source == host && v.Destination == "/host":
			sawBind = true
		}
	}
	if !sawCopy || !sawBind {
		t.Errorf("--print-stats does not report the volume copied to %s and the host directory shared: %+v", wantCopy, st.Siblings[0].Volumes)
	}
	names := func() []string {
		var n []string
		for _, v := range st.Capture.Volumes {
			n = append(n, v.Name)
		}
		return n
	}()
	if !slices.Contains(names, vol) || !slices.Contains(names, "/dev/shm") {
		t.Errorf("the capture copied %v, want %s and /dev/shm", names, vol)
	}

	// The sibling's files are the fork instant's.
	read := func(ctr, path string) string { return podman(t, "exec", ctr, "cat", path) }
	if got := read(sib, "/data/pre"); got != "pre-fork" {
		t.Errorf("the sibling's volume holds %q, want the pre-fork contents", got)
	}
	dataC, _ := strconv.Atoi(read(sib, "/data/c"))
	rootC, _ := strconv.Atoi(read(sib, "/tmp/c"))
	if dataC < rootC || dataC > rootC+1 || rootC == 0 {
		t.Errorf("the sibling's volume (counter %d) and root filesystem (counter %d) are not from one instant", dataC, rootC)
	}
	if got := read(sib, "/dev/shm/unmapped"); got != "shm-file" {
		t.Errorf("the sibling's /dev/shm holds %q, want the source's file", got)
	}
	// Writes diverge; the host directory is shared.
	podman(t, "exec", sib, "sh", "-c", "echo sibling > /data/pre; echo from-sibling > /host/h")
	if got := read(src, "/data/pre"); got != "pre-fork" {
		t.Errorf("a sibling write reached the source's volume: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(host, "h")); strings.TrimSpace(string(b)) != "from-sibling" {
		t.Errorf("the host directory is not shared: %q", b)
	}
	if !slices.Contains(volumeNames(t), wantCopy) {
		t.Fatalf("no volume %s after the fork: %v", wantCopy, volumeNames(t))
	}
	podman(t, "rm", "-f", "-v", "-t", "0", sib)
	if after := volumeNames(t); !slices.Equal(after, before) {
		t.Errorf("volumes after podman rm -v of the sibling: %v, want %v", after, before)
	}
	if got := read(src, "/data/pre"); got != "pre-fork" {
		t.Errorf("the source's volume changed: %q", got)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// --volume-mode share mounts the source's volume itself; a copy of a host
// directory, or of a volume the source does not have, is refused before
// anything is made; a fork that fails leaves no volume copy behind.
func TestPodmanForkVolumeModes(t *testing.T) {
	requireStack(t)
	vol := volume(t, "vol")
	host := t.TempDir()
	src := name(t, "vmsrc")
	podman(t, "run", "-d", "--name", src, "-v", vol+":/data", "-v", host+":/host", busybox, "sh", "-c", "echo v > /data/f; exec sleep 100000")
	eventually(t, 10*time.Second, "source ready", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/data/f"); r.code != 0 {
			return errorf("%s", r.stderr)
		}
		return nil
	})
	before := volumeNames(t)
	for _, c := range []struct{ mode, want string }{
		{"/host=copy", "always shared"},
		{"nosuch=share", "no volume named nosuch"},
		{"sometimes", "give copy, share"},
	} {
		r := forkCLI(t, "--volume-mode", c.mode, src)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("--volume-mode %s: exit %d, %q; want a refusal saying %q", c.mode, r.code, r.stderr, c.want)
		}
	}
	if left := siblingsOf(t, src); len(left) != 0 {
		t.Fatalf("siblings after refused forks: %v", left)
	}

	r := forkCLI(t, "--volume-mode", vol+"=share", "--name", src+"-sh", src)
	if r.code != 0 {
		t.Fatalf("fork with the volume shared: %s", r.stderr)
	}
	podman(t, "exec", src+"-sh", "sh", "-c", "echo shared > /data/f")
	if got := podman(t, "exec", src, "cat", "/data/f"); got != "shared" {
		t.Errorf("a shared volume is not shared: the source reads %q", got)
	}
	podman(t, "rm", "-f", "-v", "-t", "0", src+"-sh")
	if !slices.Contains(volumeNames(t), vol) {
		t.Fatal("podman rm -v of a sibling sharing the volume removed the source's volume")
	}

	// A failed fork (its hook fails) removes the copies it made.
	r = forkCLI(t, "--count", "2", "--hook", "false", src)
	if r.code == 0 {
		t.Fatal("a fork whose hook fails succeeded")
	}
	if after := volumeNames(t); !slices.Equal(after, before) {
		t.Errorf("volumes after a failed fork: %v, want %v", after, before)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}
