package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/test/inheritfd"
)

// TestMain fails the run if the tests, once all cleanups have run, left
// anything of theirs on the machine: containers, volumes, crun state,
// cgroups, fork plans or journal entries. A test that leaks is a test that fails.
func TestMain(m *testing.M) {
	inheritfd.CloseOnExec()
	code := m.Run()
	if rootfsDir != "" {
		os.RemoveAll(rootfsDir)
	}
	if os.Geteuid() == 0 {
		if leaks := leaked(); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the tests left these behind:\n  %s\n", strings.Join(leaks, "\n  "))
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

func leaked() []string {
	var out []string
	if names, err := exec.Command("/usr/bin/podman", "ps", "-a", "--format", "{{.Names}}").Output(); err == nil {
		for _, n := range strings.Fields(string(names)) {
			if strings.HasPrefix(n, "tct-") {
				out = append(out, "container "+n)
			}
		}
	}
	// Volumes the tests made, and siblings' copies of them.
	if names, err := exec.Command("/usr/bin/podman", "volume", "ls", "-q").Output(); err == nil {
		for _, n := range strings.Fields(string(names)) {
			if strings.HasPrefix(n, "tct-") {
				out = append(out, "volume "+n)
			}
		}
	}
	if ids, err := exec.Command("crun", "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(ids)) {
			if strings.HasPrefix(id, "tct-") {
				out = append(out, "crun container "+id)
			}
		}
	}
	// cgroup v1's hierarchies, and cgroup v2's one (the kernel VM).
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/tclone-test/tct-*")
	v2, _ := filepath.Glob("/sys/fs/cgroup/tclone-test/tct-*")
	cgs = append(cgs, v2...)
	for _, cg := range cgs {
		out = append(out, "cgroup "+cg)
	}
	// A lazy-pages daemon exits on its own once idle for lazy.IdleExit.
	deadline := time.Now().Add(lazy.IdleExit + 5*time.Second)
	for len(lazyDaemons()) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	for _, pid := range lazyDaemons() {
		out = append(out, fmt.Sprintf("lazy-pages daemon %d", pid))
	}
	for _, pattern := range []string{filepath.Join(hostStore.LazyImagesDir(), "*"), filepath.Join(hostStore.LazyDir(), "*")} {
		m, _ := filepath.Glob(pattern)
		out = append(out, m...)
	}
	return append(out, leftovers()...)
}
