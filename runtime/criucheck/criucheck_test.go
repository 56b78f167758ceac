package criucheck

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{
		"Version: 4.2.1\n":                        40201,
		"Version: 4.1\nGitID: v4.1-3-gabc\n":      40100,
		"Version: 3.17.1\n":                       31701,
		"criu: warning\nVersion: 4.2\nGitID: x\n": 40200,
	} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseVersion("criu: command not found"); err == nil {
		t.Error("garbage parsed as a version")
	}
}

func TestRequiredByKernel(t *testing.T) {
	cases := []struct {
		kernel string
		min    Version
	}{
		{"6.18.44-fc-v782", 40200},
		{"6.16.0", 40200},
		{"6.15.9-arch1", 31500},
		{"6.12.117+deb13-cloud-amd64", 31500},
		{"7.3.4+deb13-cloud-amd64", 40200},
	}
	for _, c := range cases {
		k, err := ParseKernel(c.kernel)
		if err != nil {
			t.Fatal(err)
		}
		if got := Required(k).Min; got != c.min {
			t.Errorf("kernel %s: min %v, want %v", c.kernel, got, c.min)
		}
	}
}

func TestNoBreakpointsWorkaround(t *testing.T) {
	if !NeedsNoBreakpointsWorkaround(40101) {
		t.Error("CRIU 4.1.1 hangs where hardware breakpoints do not fire; it needs CRIU_FAULT=130")
	}
	if NeedsNoBreakpointsWorkaround(40201) {
		t.Error("CRIU 4.2.1 detects broken breakpoints itself")
	}
	r := &Result{Version: 40101}
	if env := r.Env(); len(env) != 1 || env[0] != "CRIU_FAULT=130" {
		t.Errorf("env %v", env)
	}
}

func TestLastErrors(t *testing.T) {
	out := "Warn (a): x\nError (criu/cr-check.c:1): boom\nLooks bad.\n"
	if got := lastErrors(out); got != "Error (criu/cr-check.c:1): boom" {
		t.Errorf("got %q", got)
	}
}

// Where /run is not a tmpfs, tclone has CRIU probe the kernel once in a
// namespace of its own and mounts the cache it wrote; a fresh check makes
// it again, and never stacks a second mount.
func TestKeepKerndat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (mounts, CRIU); run the unit tests as root, as make test does")
	}
	criu, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "criu.kdat")
	t.Cleanup(func() {
		for kerndatMounted(target) {
			if unix.Unmount(target, unix.MNT_DETACH) != nil {
				break
			}
		}
	})
	store := filepath.Join(dir, "store")
	if err := keepKerndat(context.Background(), criu, nil, store, target, false); err != nil {
		t.Fatal(err)
	}
	if !kerndatMounted(target) {
		t.Fatal("the cache is not mounted")
	}
	made, err := os.ReadFile(target)
	if err != nil || len(made) < 64 {
		t.Fatalf("the mounted cache holds %d bytes (%v), want CRIU's kdat", len(made), err)
	}
	// The cache CRIU reads is the one it wrote in its tmpfs.
	if kept, _ := os.ReadFile(filepath.Join(store, "criu.kdat")); !bytes.Equal(kept, made) {
		t.Error("the mounted file is not the kept cache")
	}
	for _, fresh := range []bool{false, true} {
		if err := keepKerndat(context.Background(), criu, nil, store, target, fresh); err != nil {
			t.Fatalf("fresh=%v: %v", fresh, err)
		}
		if n := mountsAt(t, target); n != 1 {
			t.Errorf("fresh=%v: %d mounts at %s, want 1", fresh, n, target)
		}
	}
}

func mountsAt(t *testing.T, target string) int {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == target {
			n++
		}
	}
	return n
}

// A cache that could not be kept is recorded, and not tried again on every
// call until CRIU is checked anew.
func TestKerndatFailureNotRetried(t *testing.T) {
	r := &Result{Path: "/nonexistent/criu", NoKerndatCache: "mounting: permission denied"}
	if kerndatFailed(context.Background(), r, t.TempDir(), false) || r.NoKerndatCache != "mounting: permission denied" {
		t.Fatalf("a recorded failure was tried again: %+v", r)
	}
}
