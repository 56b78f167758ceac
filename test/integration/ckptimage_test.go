package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// otherHost is a second Podman on this machine standing for another host:
// its own image and container storage, run state, and network
// configuration (its default network on a bridge and subnet of its own),
// and the machine's stock runtime (crun) instead of tclone. It shares the
// kernel, CRIU and conmon, as a host of the same distribution would.
type otherHost struct {
	dir  string
	args []string
	env  []string
}

func newOtherHost(t *testing.T) *otherHost {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "tct-host2-")
	if err != nil {
		t.Fatal(err)
	}
	nets := filepath.Join(dir, "networks")
	os.MkdirAll(nets, 0o700)
	conf := filepath.Join(dir, "containers.conf")
	os.WriteFile(conf, []byte("[engine]\nruntime = \"crun\"\n\n[network]\nnetwork_config_dir = \""+nets+"\"\n"), 0o600)
	// Its default network: the machine's, on another bridge and subnet.
	var def []map[string]any
	if err := json.Unmarshal([]byte(podman(t, "network", "inspect", "podman")), &def); err != nil || len(def) != 1 {
		t.Fatalf("podman network inspect podman: %v", err)
	}
	n := def[0]
	delete(n, "containers")
	n["network_interface"] = "tcthost2"
	n["subnets"] = []map[string]string{{"subnet": "10.89.201.0/24", "gateway": "10.89.201.1"}}
	data, _ := json.Marshal(n)
	os.WriteFile(filepath.Join(nets, "podman.json"), data, 0o600)
	h := &otherHost{dir: dir,
		args: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--tmpdir", filepath.Join(dir, "tmp")},
		env:  []string{"CONTAINERS_CONF_OVERRIDE=" + conf}}
	t.Cleanup(func() {
		h.try(t, "rm", "-a", "-f", "-v", "-t", "0")
		h.try(t, "volume", "rm", "-a", "-f")
		h.try(t, "rmi", "-a", "-f")
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the other host: %v", err)
		}
	})
	return h
}

// try runs the other host's podman.
func (h *otherHost) try(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/podman", append(append([]string{}, h.args...), args...)...)
	cmd.Env = append(os.Environ(), append(h.env, "PODMAN_IGNORE_CGROUPSV1_WARNING=1")...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("other host: podman %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func (h *otherHost) podman(t *testing.T, args ...string) string {
	t.Helper()
	r := h.try(t, args...)
	if r.code != 0 {
		// A failed restore names CRIU's log, which the clean-up removes.
		log := ""
		if _, rest, ok := strings.Cut(r.stderr, "logfile `"); ok {
			if path, _, ok := strings.Cut(rest, "`"); ok {
				data, _ := os.ReadFile(path)
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				log = "\nCRIU's log, its end:\n" + strings.Join(lines[max(0, len(lines)-40):], "\n")
			}
		}
		t.Fatalf("other host: podman %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stderr, log)
	}
	return strings.TrimSpace(r.stdout)
}

func (h *otherHost) exec(ctr string) execer {
	return func(t *testing.T, a ...string) result { return h.try(t, append([]string{"exec", ctr}, a...)...) }
}

// requireState checks that a container holds what the source held at the
// branch: memory, root filesystem changes and volume, nothing of after.
func requireState(t *testing.T, in execer, what string, at report) {
	t.Helper()
	got := workloadCmd(t, in, "probe", "--hash")
	if got.MemSHA256 != at.MemSHA256 || got.Tag != at.Tag || !got.MemVerified {
		t.Errorf("%s: memory hash %s tag %q (verified %v), want the branch's %s tag %q", what, got.MemSHA256, got.Tag, got.MemVerified, at.MemSHA256, at.Tag)
	}
	if r := in(t, "cat", "/var/tmp/workload/before", "/data/f", "/etc/from-image", "/opaque/new"); r.stdout != "before\nvolume-before\nchanged\nnew\n" {
		t.Errorf("%s: files from before the branch: %q (exit %d, %s)", what, r.stdout, r.code, r.stderr)
	}
	for _, gone := range []string{"/var/tmp/workload/after", "/etc/to-delete", "/opaque/old"} {
		if r := in(t, "ls", gone); r.code == 0 {
			t.Errorf("%s: %s is there", what, gone)
		}
	}
}

// A branch exported as a checkpoint image travels through a registry to
// another host, where stock podman container restore (with crun, no
// tclone) brings its processes back with their memory, files and volume;
// and podman container branch import --image makes it a branch again,
// pulled from the registry and checked against its signature, from which
// containers start. What is not a tclone checkpoint image is refused.
func TestBranchCheckpointImage(t *testing.T) {
	requireStack(t)
	registry := startRegistry(t)
	branchStore(t)
	image := "localhost/" + uniqueName("ckbase")
	base := name(t, "ckbase")
	podman(t, "run", "--name", base, busybox, "sh", "-c", "echo image-file > /etc/from-image; echo gone > /etc/to-delete; mkdir /opaque; echo old > /opaque/old")
	podman(t, "cp", workloadBin(), base+":/workload")
	podman(t, "commit", "-q", base, image)
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", image).Run() })
	src, vol, srcExec := startWorkloadSource(t, "cksrc", image, 32)
	srcExec(t, "sh", "-c", "mkdir -p /var/tmp/workload; echo before > /var/tmp/workload/before; rm /etc/to-delete; echo changed > /etc/from-image; rm -r /opaque; mkdir /opaque; echo new > /opaque/new")
	srcExec(t, "sh", "-c", "sleep 1000001 </dev/null >/dev/null 2>&1 & echo $! > /var/tmp/workload/sleeper")
	at := workloadCmd(t, srcExec, "probe", "--hash")
	branchOK(t, "create", "--file-locks", src, "b")
	srcExec(t, "sh", "-c", "echo after > /var/tmp/workload/after")

	ref := registry + "/" + uniqueName("ckpt") + ":b"
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", ref).Run() })
	r := branchCLI(t, "export", "--image", ref, "b")
	if r.code != 0 {
		t.Fatalf("export --image: exit %d\n%s", r.code, r.stderr)
	}
	if want := "podman container restore --file-locks " + ref; !strings.Contains(r.stderr, want) {
		t.Errorf("export --image does not say how to restore (%q):\n%s", want, r.stderr)
	}
	var inspect []struct{ Annotations map[string]string }
	json.Unmarshal([]byte(podman(t, "image", "inspect", ref)), &inspect)
	if len(inspect) != 1 || inspect[0].Annotations["io.podman.annotations.checkpoint.name"] != src ||
		inspect[0].Annotations["io.tclone.restore-flags"] != "--file-locks" {
		t.Errorf("the image's annotations: %+v", inspect)
	}
	podman(t, "push", "--tls-verify=false", ref)
	var full struct{ Bytes int64 }
	if err := json.Unmarshal([]byte(branchOK(t, "export", "--image", ref+"-again", "--format", "json", "b")), &full); err != nil || full.Bytes <= 0 {
		t.Fatalf("export --format json: %v %+v", err, full)
	}
	podman(t, "rmi", ref+"-again")

	// A later branch of the source, written as a layer over the first
	// image: the memory pages and files that changed. A process that
	// was there at the first branch has exited since.
	srcExec(t, "sh", "-c", "kill $(cat /var/tmp/workload/sleeper); rm /var/tmp/workload/after")
	workloadCmd(t, srcExec, "mutate", "--tag", "second", "--mem")
	at2 := workloadCmd(t, srcExec, "probe", "--hash")
	branchOK(t, "create", "--file-locks", src, "b2")
	ref2 := registry + "/" + uniqueName("ckpt") + ":b2"
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", ref2).Run() })
	var delta struct {
		Bytes int64
		Delta *struct {
			ParentImage   string `json:"parent_image"`
			Pages         int64
			PagesInParent int64 `json:"pages_in_parent"`
			FilesInParent int   `json:"files_in_parent"`
		}
	}
	if err := json.Unmarshal([]byte(branchOK(t, "export", "--image", ref2, "--parent-image", ref, "--format", "json", "b2")), &delta); err != nil || delta.Delta == nil {
		t.Fatalf("export --parent-image --format json: %v %+v", err, delta)
	}
	d := delta.Delta
	t.Logf("delta over %s: a layer of %d bytes (the full image's: %d), %d of %d pages and %d files left to the parent", d.ParentImage, delta.Bytes, full.Bytes, d.PagesInParent, d.Pages, d.FilesInParent)
	if d.ParentImage != ref || d.Pages < 32<<20/4096 || d.PagesInParent < d.Pages*9/10 || d.FilesInParent == 0 || delta.Bytes > full.Bytes/4 {
		t.Errorf("the delta leaves too little to its parent: %+v, %d bytes against the full image's %d", d, delta.Bytes, full.Bytes)
	}
	branchFails(t, "is itself a delta over image", "export", "--image", ref2+"x", "--parent-image", ref2, "b2")
	branchFails(t, "is no checkpoint image written by podman container branch export --image", "export", "--image", ref2+"x", "--parent-image", image, "b2")
	branchFails(t, "no such image on this host", "export", "--image", ref2+"x", "--parent-image", "localhost/no-such-image:1", "b2")
	branchFails(t, "--parent-image goes with --image", "export", "--parent-image", ref, "b2", filepath.Join(t.TempDir(), "b2.tar"))
	podman(t, "push", "--tls-verify=false", ref2)

	// The other host restores it with stock Podman.
	h := newOtherHost(t)
	saved := filepath.Join(t.TempDir(), "base.tar")
	podman(t, "save", "-o", saved, image)
	h.podman(t, "load", "-i", saved)
	h.podman(t, "pull", "--tls-verify=false", ref)
	restored := uniqueName("ckrest")
	h.podman(t, "container", "restore", "--file-locks", "--name", restored, ref)
	requireState(t, h.exec(restored), "restored by stock Podman", at)
	if rt := h.podman(t, "inspect", "--format", "{{.OCIRuntime}}", restored); rt != "crun" {
		t.Errorf("the other host restored it with runtime %q, want its default crun", rt)
	}
	// The second restore brings the volume back with the delta's copy.
	h.podman(t, "rm", "-f", "-t", "0", restored)
	h.podman(t, "volume", "rm", vol)
	h.podman(t, "pull", "--tls-verify=false", ref2)
	restored2 := uniqueName("ckrest")
	h.podman(t, "container", "restore", "--file-locks", "--name", restored2, ref2)
	requireState(t, h.exec(restored2), "the delta image restored by stock Podman", at2)
	if r := h.try(t, "exec", restored2, "ps"); r.code != 0 || strings.Contains(r.stdout, "sleep 1000001") {
		t.Errorf("the delta image's restore has the process that exited before its branch (exit %d):\n%s", r.code, r.stdout)
	}
	h.podman(t, "rm", "-f", "-t", "0", restored2)

	// This host, its branch store emptied, imports it from the registry.
	branchStore(t)
	podman(t, "rmi", ref2)
	podman(t, "rmi", ref)
	branchFails(t, "HTTP", "import", "--image", ref, "--name", "from-image")
	branchOK(t, "import", "--image", ref, "--tls-verify=false", "--name", "from-image")
	started := name(t, "ckstart")
	branchOK(t, "start", "--name", started, "from-image")
	requireState(t, execIn(started), "started from the imported branch", at)
	branchOK(t, "import", "--image", ref2, "--tls-verify=false", "--name", "from-delta")
	started2 := name(t, "ckstart")
	branchOK(t, "start", "--name", started2, "from-delta")
	requireState(t, execIn(started2), "started from the imported delta image", at2)
	podman(t, "rm", "-f", "-v", "-t", "0", started2)
	branchOK(t, "rm", "from-delta")
	if l := branchList(t); len(l) != 1 || l[0].Name != "from-image" {
		t.Errorf("branches after the import: %+v", l)
	}

	// Images that are not tclone's checkpoint images.
	branchFails(t, "is no checkpoint image written by podman container branch export --image: it has 2 layers", "import", "--image", image)
	plain := name(t, "ckplain")
	podman(t, "run", "-d", "--name", plain, busybox, "sleep", "1000000")
	podmansImage := "localhost/" + uniqueName("podmanckpt")
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", podmansImage).Run() })
	podman(t, "container", "checkpoint", "--leave-running", "--create-image", podmansImage, plain)
	branchFails(t, "it has no tclone/branch): if it is a checkpoint image of Podman's, restore it with podman container restore", "import", "--image", podmansImage)
	// One layer laid out as tclone's, whose CRIU images are a symlink out.
	evil := t.TempDir()
	os.MkdirAll(filepath.Join(evil, "tclone", "branch"), 0o755)
	os.WriteFile(filepath.Join(evil, "tclone", "branch", "branch.json"), []byte("{}"), 0o644)
	os.Symlink("/etc", filepath.Join(evil, "checkpoint"))
	containerfile := filepath.Join(t.TempDir(), "Containerfile")
	os.WriteFile(containerfile, []byte("FROM scratch\nCOPY . /\n"), 0o644)
	evilImage := "localhost/" + uniqueName("evilckpt")
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", evilImage).Run() })
	podman(t, "build", "-q", "-f", containerfile, "-t", evilImage, evil)
	branchFails(t, "holds checkpoint, which is neither a directory nor a regular file", "import", "--image", evilImage)
	branchFails(t, "no such branch", "export", "--image", registry+"/"+uniqueName("none"), "no-such-branch")
	if l := branchList(t); len(l) != 1 {
		t.Errorf("refused imports left branches: %+v", l)
	}
	for _, c := range []string{src, started, base, plain} {
		podman(t, "rm", "-f", "-v", "-t", "0", c)
	}
	branchOK(t, "rm", "from-image")
	requireNoLeftovers(t)
}

// startRegistry runs a registry of the test's own (Debian's
// docker-registry) on a free loopback port, its storage in a scratch
// directory, and returns its address; both go when the test ends.
func startRegistry(t *testing.T) string {
	t.Helper()
	if missing := missingTools("docker-registry"); len(missing) > 0 {
		stackMissing(t, missing)
	}
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	conf := filepath.Join(dir, "config.yml")
	os.WriteFile(conf, []byte(fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "root"), addr)), 0o600)
	cmd := exec.Command("docker-registry", "serve", conf)
	var logb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logb, &logb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	eventually(t, 30*time.Second, "the registry answering at "+addr, func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("docker-registry exited: %v\n%s", err, logb.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/v2/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
	return addr
}
