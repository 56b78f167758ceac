package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The podman wrapper (hack/podman-wrapper.sh) finds `container fork` past
// Podman's global options and passes on the ones podman-fork understands:
// --url, --connection and --identity (as --ssh-identity, since podman-fork's
// --identity is the siblings').
func TestPodmanWrapperPassesRemoteOptions(t *testing.T) {
	script, err := os.ReadFile("../../../hack/podman-wrapper.sh")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "podman")
	// podman-fork replaced by echo: the test reads the arguments it got.
	if err := os.WriteFile(wrapper, []byte(strings.ReplaceAll(string(script), "@PODMAN_FORK@", "echo")), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ args, want string }{
		{"container fork src", "src"},
		{"--url unix:///x container fork --count 2 src", "--url=unix:///x --count 2 src"},
		{"--url=ssh://u@h/s --identity /k container fork src", "--url=ssh://u@h/s --ssh-identity=/k src"},
		{"--identity=/k2 -c build container fork src", "--ssh-identity=/k2 --connection=build src"},
		{"--connection=build --log-level debug --root /r container fork src", "--connection=build src"},
		{"--log-level=debug container fork --identity preserve src", "--debug --identity preserve src"},
	} {
		out, err := exec.Command("sh", append([]string{wrapper}, strings.Fields(c.args)...)...).Output()
		if err != nil {
			t.Fatalf("%s: %v", c.args, err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("podman %s: podman-fork got %q, want %q", c.args, got, c.want)
		}
	}
}

// `podman container branch` goes to podman-branch beside podman-fork, with
// the same options passed on; podman-branch refuses those it cannot use.
func TestPodmanWrapperRunsBranch(t *testing.T) {
	script, err := os.ReadFile("../../../hack/podman-wrapper.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "podman")
	os.WriteFile(wrapper, []byte(strings.ReplaceAll(string(script), "@PODMAN_FORK@", filepath.Join(dir, "podman-fork"))), 0o755)
	os.WriteFile(filepath.Join(dir, "podman-branch"), []byte("#!/bin/sh\necho branch \"$@\"\n"), 0o755)
	for _, c := range []struct{ args, want string }{
		{"container branch ls", "branch ls"},
		{"--url unix:///x --log-level=debug container branch create src b", "branch --url=unix:///x --debug create src b"},
	} {
		out, err := exec.Command("sh", append([]string{wrapper}, strings.Fields(c.args)...)...).Output()
		if err != nil {
			t.Fatalf("%s: %v", c.args, err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("podman %s: got %q, want %q", c.args, got, c.want)
		}
	}
}
