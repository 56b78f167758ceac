package fork

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/test/testenv"
)

func TestSiblingHostname(t *testing.T) {
	src := strings.Repeat("a", 64)
	sib := "b1b2b3b4b5b6" + strings.Repeat("c", 52)
	p := &plan.Plan{Source: plan.Source{ID: src, Hostname: src[:12]}, Identity: forkopts.IdentityUnique}
	cases := []struct {
		name     string
		identity forkopts.Identity
		config   string
		want     string
	}{
		{"inherited default hostname gets the sibling's short ID", forkopts.IdentityUnique, src[:12], "b1b2b3b4b5b6"},
		{"no hostname in the config", forkopts.IdentityUnique, "", "b1b2b3b4b5b6"},
		{"explicit hostname wins", forkopts.IdentityUnique, "trial", "trial"},
		{"preserve keeps the captured one", forkopts.IdentityPreserve, src[:12], ""},
		{"explicit hostname wins over preserve", forkopts.IdentityPreserve, "trial", "trial"},
	}
	for _, c := range cases {
		p.Identity = c.identity
		if got := siblingHostname(p, &specs.Spec{Hostname: c.config}, sib); got != c.want {
			t.Errorf("%s: got %q want %q", c.name, got, c.want)
		}
	}
}

func TestFreshMachineID(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	old := "0123456789abcdef0123456789abcdef\n"
	os.WriteFile(filepath.Join(root, "etc/machine-id"), []byte(old), 0o444)
	changed, err := freshMachineID(root)
	if err != nil || !changed {
		t.Fatalf("changed %v err %v", changed, err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "etc/machine-id"))
	if string(got) == old || len(got) != len(old) || !machineIDRE.Match(got) {
		t.Fatalf("new machine-id %q", got)
	}
	// An empty machine-id means "none": nothing to duplicate.
	os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444)
	if changed, _ := freshMachineID(root); changed {
		t.Fatal("an empty machine-id was filled in")
	}
}

func TestRewriteNameFilesOnlyTouchesTheSiblingsOwn(t *testing.T) {
	bundle := t.TempDir()
	shared := t.TempDir()
	hosts := filepath.Join(bundle, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n10.88.0.5\told old-name\n# old\n"), 0o644)
	hostname := filepath.Join(bundle, "hostname")
	os.WriteFile(hostname, []byte("old\n"), 0o644)
	hostHosts := filepath.Join(shared, "hosts")
	os.WriteFile(hostHosts, []byte("10.0.0.1 old\n"), 0o644)
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/etc/hosts", Source: hosts, Options: []string{"bind"}},
		{Destination: "/etc/hostname", Source: hostname, Options: []string{"rbind"}},
		{Destination: "/etc/hosts2", Source: hostHosts, Options: []string{"bind"}},
	}}
	if err := rewriteNameFiles(spec, bundle, "sib", "old", "new"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(hosts)
	if string(got) != "127.0.0.1\tlocalhost\n10.88.0.5\tnew\told-name\n# old\n" {
		t.Errorf("hosts %q", got)
	}
	if got, _ := os.ReadFile(hostname); string(got) != "new\n" {
		t.Errorf("hostname %q", got)
	}
	if got, _ := os.ReadFile(hostHosts); string(got) != "10.0.0.1 old\n" {
		t.Errorf("a file outside the sibling was changed: %q", got)
	}
}

// A source container can leave /etc a symlink to a host directory: the
// sibling's new machine-id must still land inside its own root.
func TestFreshMachineIDStaysInsideRoot(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	hostID := "0123456789abcdef0123456789abcdef\n"
	os.WriteFile(filepath.Join(host, "machine-id"), []byte(hostID), 0o444)
	if err := os.Symlink(host, filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	freshMachineID(root)
	if got, _ := os.ReadFile(filepath.Join(host, "machine-id")); string(got) != hostID {
		t.Fatalf("a file outside the sibling's root was rewritten: %q", got)
	}
}

func TestOwnedBySibling(t *testing.T) {
	id := strings.Repeat("c", 64)
	for path, want := range map[string]bool{
		"/b/hosts":        true,
		"/b/sub/hostname": true,
		"/b":              false,
		"/run/containers/storage/overlay-containers/" + id + "/userdata/hosts": true,
		"/run/containers/storage/overlay-containers/other/userdata/hosts":      false,
		"/etc/hosts": false,
	} {
		if got := ownedBySibling(path, "/b", id); got != want {
			t.Errorf("ownedBySibling(%s) = %v, want %v", path, got, want)
		}
	}
	// A sibling named like a host directory does not own it.
	if ownedBySibling("/etc/hosts", "/b", "etc") {
		t.Error("a sibling called etc owns /etc/hosts")
	}
}

// A sibling whose config joins a UTS namespace (a Kubernetes pod's) gets
// that namespace's hostname, not one of its own.
func TestSiblingHostnameOfAJoinedUTSNamespace(t *testing.T) {
	testenv.NeedRoot(t, "making a UTS namespace")
	cmd := exec.Command("unshare", "--uts", "sh", "-c", "hostname pod-fork-1 && echo ready && exec sleep 600")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		testenv.Missing(t, "unshare: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("the namespace holder: %v", err)
	}
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
		{Type: specs.UTSNamespace, Path: fmt.Sprintf("/proc/%d/ns/uts", cmd.Process.Pid)},
	}}}
	p := &plan.Plan{Identity: forkopts.IdentityUnique}
	p.Source.Hostname = "pod"
	if got := siblingHostname(p, spec, strings.Repeat("a", 64)); got != "pod-fork-1" {
		t.Fatalf("hostname %q, want the joined namespace's pod-fork-1", got)
	}
	if self, _ := os.Hostname(); self == "pod-fork-1" {
		t.Fatal("reading the namespace's hostname changed this process's")
	}
}
