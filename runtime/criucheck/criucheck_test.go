package criucheck

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks"
)

func TestVersionOf(t *testing.T) {
	for _, c := range []struct {
		v    *rpc.CriuVersion
		want Version
	}{
		{&rpc.CriuVersion{MajorNumber: proto.Int32(4), MinorNumber: proto.Int32(2), Sublevel: proto.Int32(1)}, 40201},
		// A build from git counts as the release it names.
		{&rpc.CriuVersion{MajorNumber: proto.Int32(4), MinorNumber: proto.Int32(1), Gitid: proto.String("v4.1-3-gabc")}, 40100},
		{&rpc.CriuVersion{MajorNumber: proto.Int32(3), MinorNumber: proto.Int32(17), Sublevel: proto.Int32(1)}, 31701},
		{&rpc.CriuVersion{MajorNumber: proto.Int32(4), MinorNumber: proto.Int32(2), Gitid: proto.String("x")}, 40200},
	} {
		if got := versionOf(c.v); got != c.want {
			t.Errorf("versionOf(%v) = %v, want %v", c.v, got, c.want)
		}
	}
}

// A criu that cannot run is refused saying why, in its own words, and how
// to repair it.
func TestCheckRefusesBrokenCriu(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "criu")
	os.WriteFile(fake, []byte("#!/bin/sh\necho 'criu: error while loading shared libraries: libnet.so.1: cannot open shared object file' >&2\nexit 127\n"), 0o755)
	_, err := check(context.Background(), fake, "6.18.0")
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("error %v, want a criucheck.Error", err)
	}
	if !strings.Contains(cerr.What, "libnet.so.1") || !strings.Contains(cerr.What, fake) || !strings.Contains(cerr.Fix, "ldconfig") {
		t.Fatalf("error %q does not say what failed and how to repair it", err)
	}
}

// hostCriu is this host's criu, for a test that needs root for what.
func hostCriu(t *testing.T, what string) string {
	if os.Geteuid() != 0 {
		t.Fatalf("needs root (%s); run the unit tests as root, as make test does", what)
	}
	criu, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	return criu
}

// The version and the lazy-pages support CRIU gives over RPC are what its
// commands say: `criu --version` and `criu check --feature uffd-noncoop`.
func TestRPCMatchesCommands(t *testing.T) {
	criu := hostCriu(t, "CRIU")
	ctx := context.Background()
	out, err := exec.Command(criu, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("criu --version: %q", out)
	}
	var want Version
	for i, scale := range []Version{10000, 100, 1} {
		n, _ := strconv.Atoi(m[i+1])
		want += Version(n) * scale
	}
	v, err := criuhooks.Version(ctx, criu, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := versionOf(v); got != want {
		t.Errorf("RPC version %v, criu --version %v", got, want)
	}

	env := (&Result{Version: want}).Env()
	cmd := exec.Command(criu, "check", "--feature", "uffd-noncoop")
	cmd.Env = append(os.Environ(), env...)
	wantLazy := cmd.Run() == nil
	if lazy, why := checkLazyPages(ctx, criu, env); lazy != wantLazy || (why == "") != lazy {
		t.Errorf("lazy pages %v (%q); criu check --feature uffd-noncoop says %v", lazy, why, wantLazy)
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
	criu := hostCriu(t, "mounts, CRIU")
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
