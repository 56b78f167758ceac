package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// branchStore points the branch commands of this test at a store of its
// own, removed when it ends.
func branchStore(t *testing.T) branch.Store {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("TCLONE_BRANCH_DIR", dir)
	return branch.Store{Dir: dir}
}

func branchCLI(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, 5*time.Minute, podmanCLI, append([]string{"container", "branch"}, args...)...)
}

// branchOK runs a branch command that must succeed and returns its output.
func branchOK(t *testing.T, args ...string) string {
	t.Helper()
	r := branchCLI(t, args...)
	if r.code != 0 {
		t.Fatalf("podman container branch %s: exit %d\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// branchFails runs a branch command that must fail saying want.
func branchFails(t *testing.T, want string, args ...string) {
	t.Helper()
	r := branchCLI(t, args...)
	if r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("podman container branch %s: exit %d, stderr %q; want a failure saying %q", strings.Join(args, " "), r.code, r.stderr, want)
	}
}

func branchList(t *testing.T) []branch.Info {
	t.Helper()
	var out []branch.Info
	if err := json.Unmarshal([]byte(branchOK(t, "ls", "--format", "json")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// workloadSource runs the fidelity workload holding memMiB of memory in
// image, with a named volume at /data, and waits until it answers.
func workloadSource(t *testing.T, prefix, image string, memMiB int) (src, vol string, exec execer) {
	t.Helper()
	return startWorkloadSource(t, prefix, image, memMiB, "-v", workloadBin()+":/workload:ro")
}

// startWorkloadSource is workloadSource with the run's own options: an
// image that holds /workload itself needs no bind mount of it.
func startWorkloadSource(t *testing.T, prefix, image string, memMiB int, opts ...string) (src, vol string, exec execer) {
	t.Helper()
	// Cleanups run last first: the container goes before its volume.
	vol = volume(t, prefix+"v")
	src = name(t, prefix)
	args := append([]string{"run", "-d", "--name", src}, opts...)
	podman(t, append(args, "-v", vol+":/data", image,
		"sh", "-c", "echo volume-before > /data/f; /workload serve --mem-mib "+strconv.Itoa(memMiB)+"; sleep 1000000")...)
	exec = func(t *testing.T, a ...string) result { return podmanTry(t, append([]string{"exec", src}, a...)...) }
	workloadCmd(t, exec, "probe")
	return src, vol, exec
}

func execIn(ctr string) execer {
	return func(t *testing.T, a ...string) result { return podmanTry(t, append([]string{"exec", ctr}, a...)...) }
}

// requireBranchState checks that a container started from a branch holds
// what the source held when the branch was taken.
func requireBranchState(t *testing.T, ctr string, at report) {
	t.Helper()
	got := workloadCmd(t, execIn(ctr), "probe", "--hash")
	if got.MemSHA256 != at.MemSHA256 || got.Tag != at.Tag || !got.MemVerified {
		t.Errorf("%s: memory hash %s tag %q (verified %v), want the branch's %s tag %q", ctr, got.MemSHA256, got.Tag, got.MemVerified, at.MemSHA256, at.Tag)
	}
	if r := podmanTry(t, "exec", ctr, "cat", "/var/tmp/workload/before", "/data/f"); r.stdout != "before\nvolume-before\n" {
		t.Errorf("%s: files from before the branch: %q (exit %d)", ctr, r.stdout, r.code)
	}
	if r := podmanTry(t, "exec", ctr, "cat", "/var/tmp/workload/after"); r.code == 0 {
		t.Errorf("%s: a file written after the branch: %q", ctr, r.stdout)
	}
}

// A branch keeps a workspace's state on disk: it starts any number of
// containers, after its source is gone and after the plan store and the
// Podman service are gone (a reboot), and its removal leaves them alone.
func TestBranchLifecycle(t *testing.T) {
	requireStack(t)
	store := branchStore(t)
	src, _, srcExec := workloadSource(t, "brsrc", workspace, 64)
	if r := srcExec(t, "sh", "-c", "mkdir -p /var/tmp/workload; echo before > /var/tmp/workload/before"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	at := workloadCmd(t, srcExec, "probe", "--hash")

	var st podmanfork.BranchStats
	if err := json.Unmarshal([]byte(branchOK(t, "create", "--file-locks", "--print-stats", "-l", "stage=one", src, "b1")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Branch == nil || st.SourcePauseMs <= 0 || st.DurableMs < st.CheckpointMs || st.Branch.Size.Files < 64<<20 {
		t.Fatalf("create stats: %+v", st)
	}
	t.Logf("branch create: pause %.1f ms, capture %.1f ms, durable after %.1f ms, %d MiB of images, %d MiB on disk",
		st.SourcePauseMs, st.CheckpointMs, st.DurableMs, st.Branch.Size.Files>>20, st.Branch.Size.ChunksAdded>>20)
	// The source runs on, and changes.
	if err := counterAdvancesWorkload(t, srcExec); err != nil {
		t.Fatal(err)
	}
	srcExec(t, "sh", "-c", "echo after > /var/tmp/workload/after")
	workloadCmd(t, srcExec, "mutate", "--tag", "after-branch", "--mem")
	branchFails(t, "a branch named b1 exists", "create", src, "b1")

	list := branchList(t)
	if len(list) != 1 || list[0].Name != "b1" || list[0].State != branch.StateDurable || list[0].Source.Name != src || list[0].Labels["stage"] != "one" {
		t.Fatalf("ls: %+v", list)
	}
	var inspected []branch.Branch
	json.Unmarshal([]byte(branchOK(t, "inspect", "b1")), &inspected)
	if len(inspected) != 1 || inspected[0].ID != st.Branch.ID || inspected[0].Plan.Tree.Processes < 2 {
		t.Fatalf("inspect: %+v", inspected)
	}

	var sibs []struct{ ID, Name string }
	out := branchOK(t, "start", "--count", "3", "--format", "json", "b1")
	if err := json.Unmarshal([]byte(out), &sibs); err != nil || len(sibs) != 3 {
		t.Fatalf("start -n 3: %v %q", err, out)
	}
	for _, s := range sibs {
		t.Cleanup(func() { removeContainers(t, s.Name) })
		if l := podman(t, "inspect", "--format", `{{index .Config.Labels "io.tclone.branch"}}`, s.Name); l != st.Branch.ID {
			t.Errorf("%s: label io.tclone.branch %q, want %s", s.Name, l, st.Branch.ID)
		}
		requireBranchState(t, s.Name, at)
	}

	// The source goes; the branch stays.
	podman(t, "rm", "-f", "-t", "0", src)
	after := name(t, "brafter")
	branchOK(t, "start", "--name", after, "b1")
	requireBranchState(t, after, at)

	// A reboot: no plan, no Podman service. The command starts a service
	// of its own.
	running := exec.Command("../../hack/podman-service.sh", "status").Run() == nil
	if running {
		if out, err := exec.Command("../../hack/podman-service.sh", "stop").CombinedOutput(); err != nil {
			t.Fatalf("stopping the Podman service: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("../../hack/podman-service.sh", "start").Run() })
	}
	plans, _ := filepath.Glob(hostStore.Dir("*"))
	for _, p := range plans {
		os.RemoveAll(p)
	}
	reboot := name(t, "brreboot")
	branchOK(t, "start", "--name", reboot, "b1")
	requireBranchState(t, reboot, at)
	if running {
		if out, err := exec.Command("../../hack/podman-service.sh", "start").CombinedOutput(); err != nil {
			t.Fatalf("starting the Podman service again: %v: %s", err, out)
		}
		// Started from this test's directory, the service must not keep
		// it: conmon inherits it, and fails once it is gone.
		pid, _ := os.ReadFile("/run/podman/tclone-service.pid")
		if cwd, err := os.Readlink("/proc/" + strings.TrimSpace(string(pid)) + "/cwd"); err != nil || cwd != "/" {
			t.Errorf("the Podman service runs in %q (%v), want /", cwd, err)
		}
	}

	// Removing the branch leaves what it started, and its data.
	if got := strings.TrimSpace(branchOK(t, "rm", "b1")); got != "b1" {
		t.Errorf("rm printed %q", got)
	}
	if l := branchList(t); len(l) != 0 {
		t.Errorf("ls after rm: %+v", l)
	}
	for _, s := range append([]string{after, reboot}, sibs[0].Name) {
		if state(t, s) != "running" {
			t.Errorf("%s is %s after its branch was removed", s, state(t, s))
		}
	}
	if chunks, _ := filepath.Glob(filepath.Join(store.Dir, "chunks", "*", "*")); len(chunks) != 0 {
		t.Errorf("%d chunks left after the only branch was removed", len(chunks))
	}
	branchFails(t, "no such branch", "start", "b1")
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// counterAdvancesWorkload checks that the workload's counter moves.
func counterAdvancesWorkload(t *testing.T, in execer) error {
	a := workloadCmd(t, in, "probe").Counter
	time.Sleep(300 * time.Millisecond)
	if b := workloadCmd(t, in, "probe").Counter; b <= a {
		return errorf("the source's counter is stuck at %d", a)
	}
	return nil
}

// Diff, prune and the export/import round trip, on a busybox source made
// from an image of its own, which is then removed: the import names it.
// The image holds the workload itself: a start of an imported branch gives
// no host directory, so the source mounts none.
func TestBranchDiffPruneExportImport(t *testing.T) {
	requireStack(t)
	store := branchStore(t)
	image := "localhost/" + uniqueName("brimg")
	base := name(t, "brbase")
	podman(t, "run", "--name", base, busybox, "sh", "-c", "echo image-file > /etc/from-image; echo gone > /etc/to-delete")
	podman(t, "cp", workloadBin(), base+":/workload")
	podman(t, "commit", "-q", base, image)
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", image).Run() })
	src, _, srcExec := startWorkloadSource(t, "brdiff", image, 16)

	srcExec(t, "sh", "-c", "mkdir -p /var/tmp/workload; echo before > /var/tmp/workload/before; echo one > /tmp/edited")
	branchOK(t, "create", "--file-locks", src, "b-1")
	srcExec(t, "sh", "-c", "echo two > /tmp/edited; echo new > /tmp/added; rm /etc/to-delete; echo changed > /etc/from-image")
	at := workloadCmd(t, srcExec, "probe", "--hash")
	branchOK(t, "create", "--file-locks", "-l", podmanfork.LabelKeep+"=true", src, "b-2")
	branchOK(t, "create", "--file-locks", src, "b-3")

	var d branch.Diff
	if err := json.Unmarshal([]byte(branchOK(t, "diff", "--format", "json", "b-1", "b-2")), &d); err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range d.Files {
		if !strings.HasPrefix(f.Path, "/var/tmp/workload/") {
			files = append(files, f.Kind+" "+f.Path)
		}
	}
	for _, want := range []string{"A /tmp/added", "C /tmp/edited", "D /etc/to-delete", "C /etc/from-image"} {
		if !slices.Contains(files, want) {
			t.Errorf("diff b-1 b-2 lacks %q: %v", want, files)
		}
	}
	if d.Lineage.Relation != "same-source" || len(d.Labels) != 1 || d.Size.SharedBytes == 0 {
		t.Errorf("diff: lineage %+v, labels %+v, shared %d", d.Lineage, d.Labels, d.Size.SharedBytes)
	}
	if txt := branchOK(t, "diff", "b-1", "b-2"); !strings.Contains(txt, "A /tmp/added\n") {
		t.Errorf("diff text: %s", txt)
	}

	// prune: a dry run first, which removes nothing.
	dry := branchOK(t, "prune", "--keep-last", "1")
	if !strings.Contains(dry, "b-1") || strings.Contains(dry, "b-3") || !strings.Contains(dry, "kept by their io.tclone.keep label: b-2") ||
		!strings.Contains(dry, "--yes") || len(branchList(t)) != 3 {
		t.Errorf("prune dry run:\n%s", dry)
	}
	branchFails(t, "say what to prune", "prune")
	branchOK(t, "prune", "--keep-last", "1", "--yes")
	var names []string
	for _, b := range branchList(t) {
		names = append(names, b.Name)
	}
	if !slices.Equal(names, []string{"b-2", "b-3"}) {
		t.Errorf("after prune --yes: %v", names)
	}

	// Export, remove, import, start.
	file := filepath.Join(t.TempDir(), "b-2.tar.zst")
	branchOK(t, "export", "b-2", file)
	branchOK(t, "rm", "b-2", "b-3")
	importedID := strings.TrimSpace(branchOK(t, "import", "--name", "b-2i", file))
	// As from another host: the layers the capture sat on are elsewhere
	// there, and found again by the image.
	manifest := filepath.Join(store.Dir, "branches", importedID, "branch.json")
	var m map[string]any
	data, _ := os.ReadFile(manifest)
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["plan"].(map[string]any)["rootfs"].(map[string]any)["lower_dirs"] = []string{"/var/lib/containers/storage/overlay/tct-elsewhere/diff"}
	data, _ = json.Marshal(m)
	os.WriteFile(manifest, data, 0o600)
	started := name(t, "brimp")
	branchOK(t, "start", "--name", started, "b-2i")
	requireBranchState(t, started, at)
	if r := podmanTry(t, "exec", started, "cat", "/tmp/edited", "/tmp/added", "/etc/from-image"); r.stdout != "two\nnew\nchanged\n" {
		t.Errorf("files of the imported branch: %q", r.stdout)
	}
	if r := podmanTry(t, "exec", started, "ls", "/etc/to-delete"); r.code == 0 {
		t.Error("a file the source deleted is back")
	}

	// Without its image, an import says which image is missing.
	for _, c := range []string{src, started, base} {
		podman(t, "rm", "-f", "-v", "-t", "0", c)
	}
	podman(t, "rmi", image)
	branchOK(t, "rm", "b-2i")
	branchFails(t, "needs image "+image, "import", file)
	if l := branchList(t); len(l) != 0 {
		t.Errorf("a refused import left %+v", l)
	}
	if chunks, _ := filepath.Glob(filepath.Join(store.Dir, "chunks", "*", "*")); len(chunks) != 0 {
		t.Errorf("%d chunks left", len(chunks))
	}
	requireNoLeftovers(t)
}

// Bad input is refused before anything is made; a corrupt chunk is found
// when a branch starts, and the start leaves nothing.
func TestBranchRefusals(t *testing.T) {
	requireStack(t)
	store := branchStore(t)
	src := name(t, "brbad")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	branchFails(t, "invalid branch name", "create", src, "-bad")
	branchFails(t, "no container", "create", name(t, "brnone"), "x")
	branchOK(t, "create", src, "ok")
	branchFails(t, "give it to podman container branch create", "start", "--files-only", "ok")
	branchFails(t, "no such branch", "start", "nope")
	branchFails(t, "no such branch", "rm", "ok", "nope")
	if len(branchList(t)) != 1 {
		t.Fatal("a failed rm of two branches removed one")
	}

	// A chunk changed on disk.
	var b []branch.Branch
	json.Unmarshal([]byte(branchOK(t, "inspect", "ok")), &b)
	victim := b[0].Files[0].Chunks[0].Hash
	path := filepath.Join(store.Dir, "chunks", victim[:2], victim)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	os.WriteFile(path, data, 0o600)
	branchFails(t, victim[:16], "start", "ok")
	branchFails(t, "podman container branch rm ok", "start", "ok")
	if out := podman(t, "ps", "-a", "--filter", "label=io.tclone.branch="+b[0].ID, "--format", "{{.Names}}"); out != "" {
		t.Errorf("a failed start left %s", out)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// kill -9 of the command while it writes the branch: the source ran on
// all along, no branch is visible, and tclone gc removes what it wrote.
func TestBranchKilledWhileWriting(t *testing.T) {
	requireStack(t)
	store := branchStore(t)
	src, _, srcExec := workloadSource(t, "brkill", workspace, 768)
	cmd := exec.Command(podmanCLI, "container", "branch", "create", "--file-locks", src, "killed")
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Chunks are written only after the capture, with the source running.
	writing := false
	deadline := time.Now().Add(2 * time.Minute)
	for !writing && time.Now().Before(deadline) {
		chunks, _ := filepath.Glob(filepath.Join(store.Dir, "chunks", "*", "*"))
		writing = len(chunks) > 20
		select {
		case err := <-exited:
			t.Fatalf("the create ended before it was killed (%v): make the workload bigger", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if !writing {
		t.Fatal("the create never began writing")
	}
	if l := branchList(t); len(l) != 1 || l[0].State != branch.StateWriting {
		t.Errorf("ls while writing: %+v", l)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	if err := counterAdvancesWorkload(t, srcExec); err != nil {
		t.Fatal(err)
	}
	if l := branchList(t); len(l) != 0 {
		t.Errorf("a killed create left a visible branch: %+v", l)
	}
	r := run(t, 2*time.Minute, tcloneBin(), "gc")
	if r.code != 0 {
		t.Fatalf("tclone gc: %s", r.stderr)
	}
	var rep struct {
		Branches branch.Removed `json:"branches"`
	}
	json.Unmarshal([]byte(r.stdout), &rep)
	if len(rep.Branches.Partial) != 1 || rep.Branches.Chunks == 0 {
		t.Errorf("gc removed %+v", rep.Branches)
	}
	for _, pattern := range []string{".partial/*", "chunks/*/*"} {
		if left, _ := filepath.Glob(filepath.Join(store.Dir, pattern)); len(left) != 0 {
			t.Errorf("left after gc: %v", left)
		}
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
	// The name is free again.
	branchOK(t, "create", "--file-locks", src, "killed")
}

// The branch verbs through tclone's API service, with Podman's statuses
// and error bodies.
func TestRESTBranches(t *testing.T) {
	requireStack(t)
	branchStore(t) // the service inherits the store
	svc := startAPIService(t)
	src := name(t, "brrest")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	base := apiVersion + "/libpod/branches"
	expect := func(method, path string, want int) string {
		t.Helper()
		status, body := svc.curl(t, method, path)
		if status != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, status, body, want)
		}
		if want >= 400 {
			if _, code := errorBody(t, body); code != want {
				t.Errorf("%s %s: error body says %d", method, path, code)
			}
		}
		return body
	}
	create := apiVersion + "/libpod/containers/" + src + "/branches"
	var st podmanfork.BranchStats
	json.Unmarshal([]byte(expect("POST", create+"?name=rb&label=k=v", 200)), &st)
	if st.Branch == nil || st.Branch.Name != "rb" || st.Branch.Labels["k"] != "v" || st.SourcePauseMs <= 0 {
		t.Fatalf("create: %+v", st)
	}
	expect("POST", create+"?name=rb", 409)
	expect("POST", create, 400)
	expect("POST", create+"?name=x&bogus=1", 400)
	expect("POST", apiVersion+"/libpod/containers/"+name(t, "brnone")+"/branches?name=x", 404)
	expect("GET", create+"?name=x", 405)

	var list []branch.Info
	json.Unmarshal([]byte(expect("GET", base, 200)), &list)
	if len(list) != 1 || list[0].Name != "rb" || list[0].State != branch.StateDurable {
		t.Fatalf("ls: %+v", list)
	}
	if body := expect("GET", base+"?source="+src, 200); !strings.Contains(body, `"rb"`) {
		t.Errorf("ls of the source: %s", body)
	}
	expect("GET", base+"/rb/json", 200)
	expect("GET", base+"/nope/json", 404)
	expect("GET", base+"/rb/diff?with=rb", 200)
	expect("GET", base+"/rb/diff", 400)

	var started podmanfork.Stats
	json.Unmarshal([]byte(expect("POST", base+"/rb/start?count=2", 200)), &started)
	if len(started.Siblings) != 2 || started.Branch != st.Branch.ID {
		t.Fatalf("start: %+v", started)
	}
	for _, s := range started.Siblings {
		t.Cleanup(func() { removeContainers(t, s.Name) })
		if readCounter(t, s.Name) == 0 {
			t.Errorf("%s does not count", s.Name)
		}
	}
	expect("POST", base+"/rb/start?files-only=true", 400)
	expect("POST", base+"/nope/start", 404)

	// Export and import through the service.
	archive := filepath.Join(t.TempDir(), "rb.tar.zst")
	if r := run(t, time.Minute, "curl", "-sS", "-f", "--unix-socket", svc.socket, "-o", archive, "http://d"+base+"/rb/export"); r.code != 0 {
		t.Fatalf("export: %s", r.stderr)
	}
	expect("GET", base+"/nope/export", 404)
	postFile := func(path string) (int, string) {
		r := run(t, time.Minute, "curl", "-sS", "--unix-socket", svc.socket, "-X", "POST", "--data-binary", "@"+archive,
			"-H", "Content-Type: application/zstd", "-w", "\n%{http_code}", "http://d"+path)
		out := strings.TrimSpace(r.stdout)
		i := strings.LastIndex(out, "\n")
		status, _ := strconv.Atoi(out[i+1:])
		return status, out[:max(i, 0)]
	}
	if status, body := postFile(base + "/import?name=rb-imp"); status != 200 || !strings.Contains(body, `"rb-imp"`) {
		t.Fatalf("import: %d %s", status, body)
	}
	if status, _ := postFile(base + "/import?name=rb-imp"); status != 409 {
		t.Errorf("a second import as rb-imp: %d, want 409", status)
	}
	os.WriteFile(archive, []byte("not an archive"), 0o600)
	if status, _ := postFile(base + "/import?name=other"); status != 400 {
		t.Errorf("import of garbage: %d, want 400", status)
	}
	expect("DELETE", base+"/rb-imp", 200)

	// Checkpoint images through the service: a full one, a delta over it,
	// and the delta imported as a branch.
	full, delta := "localhost/"+uniqueName("rbimg")+":rb", "localhost/"+uniqueName("rbimg")+":rb2"
	t.Cleanup(func() { exec.Command("/usr/bin/podman", "rmi", "-f", delta, full).Run() })
	var x hostagent.ImageExport
	json.Unmarshal([]byte(expect("POST", base+"/rb/export?image="+full, 200)), &x)
	if x.ID == "" || x.Bytes <= 0 || x.Delta != nil {
		t.Fatalf("export of a full image: %+v", x)
	}
	x = hostagent.ImageExport{}
	json.Unmarshal([]byte(expect("POST", base+"/rb/export?image="+delta+"&parent-image="+full, 200)), &x)
	if x.Delta == nil || x.Delta.Pages == 0 || x.Delta.PagesInParent != x.Delta.Pages {
		t.Fatalf("export of a delta of the same branch over its own image: %+v", x)
	}
	expect("POST", base+"/rb/export", 400)
	expect("POST", base+"/rb/export?image="+delta+"x&parent-image=localhost/no-such-image:1", 400)
	expect("POST", base+"/nope/export?image="+delta+"x", 404)
	expect("POST", base+"/import?image="+delta+"&tls-verify=maybe", 400)
	if body := expect("POST", base+"/import?image="+delta+"&name=rb-img", 200); !strings.Contains(body, `"rb-img"`) {
		t.Fatalf("import of the delta image: %s", body)
	}
	expect("DELETE", base+"/rb-img", 200)

	expect("POST", base+"/prune", 400)
	if body := expect("POST", base+"/prune?keep-last=0", 200); !strings.Contains(body, `"rb"`) || len(branchList(t)) != 1 {
		t.Errorf("prune dry run: %s", body)
	}
	expect("POST", base+"/prune?keep-last=0&yes=true", 200)
	expect("DELETE", base+"/rb", 404)
	if l := branchList(t); len(l) != 0 {
		t.Errorf("after prune: %+v", l)
	}
	for _, s := range started.Siblings {
		if state(t, s.Name) != "running" {
			t.Errorf("%s stopped when its branch was pruned", s.Name)
		}
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}

// --wait runnable returns once the source runs on; the branch is written
// after, by a process of its own, and a start waits for it.
func TestBranchCreateRunnable(t *testing.T) {
	requireStack(t)
	branchStore(t)
	src, _, srcExec := workloadSource(t, "brrun", workspace, 512)
	srcExec(t, "sh", "-c", "mkdir -p /var/tmp/workload; echo before > /var/tmp/workload/before")
	at := workloadCmd(t, srcExec, "probe", "--hash")
	branchFails(t, "needs --wait durable", "create", "--wait", "runnable", "--print-stats", src, "rb")
	branchFails(t, "give runnable", "create", "--wait", "soon", src, "rb")
	id := strings.TrimSpace(branchOK(t, "create", "--wait", "runnable", "--file-locks", src, "rb"))
	returned := time.Now()
	srcExec(t, "sh", "-c", "echo after > /var/tmp/workload/after")
	workloadCmd(t, srcExec, "mutate", "--tag", "after-branch", "--mem")
	if l := branchList(t); len(l) != 1 || l[0].ID != id || (l[0].State != branch.StateWriting && l[0].State != branch.StateDurable) {
		t.Fatalf("ls after a runnable create: %+v", l)
	}
	// The start waits until the branch is durable.
	started := name(t, "brrunsib")
	branchOK(t, "start", "--name", started, "rb")
	requireBranchState(t, started, at)
	var b []branch.Branch
	json.Unmarshal([]byte(branchOK(t, "inspect", "rb")), &b)
	if len(b) != 1 || !b[0].DurableAt.After(returned) {
		t.Errorf("the branch was durable at %v, before the command returned at %v: it did not return at runnable", b[0].DurableAt, returned)
	}
	if err := counterAdvancesWorkload(t, srcExec); err != nil {
		t.Error(err)
	}
	requireNoLeftovers(t)
	requireNoLiveCalls(t)
}
