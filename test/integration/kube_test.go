package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/shim/kubefork"
)

// The Kubernetes tests fork pods through a real containerd (its CRI plugin,
// the runc v2 shim running tclone as the runtime class tclone), with crictl
// as the kubelet's stand-in, and images pulled from a real local registry
// (Debian's docker-registry). `make integration-test` starts both
// (hack/containerd.sh, hack/registry.sh).

const (
	kubeEndpoint = "unix:///run/tclone-containerd/containerd.sock"
	kubeBusybox  = "localhost:5000/tclone-busybox:latest"
)

// requireKube fails (or skips, without TCLONE_REQUIRE=1) when containerd,
// crictl or the registry are missing.
func requireKube(t *testing.T) {
	t.Helper()
	missing := missingTools("containerd", "crictl", tcloneBin(), workloadBin())
	if len(missing) == 0 {
		if _, err := crictlTry("version"); err != nil {
			missing = append(missing, "containerd at "+kubeEndpoint+" (hack/containerd.sh start)")
		}
		if _, err := crictlTry("inspecti", kubeBusybox); err != nil {
			if _, err := crictlTry("pull", kubeBusybox); err != nil {
				missing = append(missing, "image "+kubeBusybox+" (hack/registry.sh start)")
			}
		}
	}
	stackMissing(t, missing)
}

func crictlTry(args ...string) (string, error) {
	cmd := exec.Command("crictl", append([]string{"--runtime-endpoint", kubeEndpoint, "--image-endpoint", kubeEndpoint, "--timeout", "2m"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func crictl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := crictlTry(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubePod is a pod the test runs, as the kubelet would: its own PID
// namespace per container, a log directory, the kubelet's labels.
type kubePod struct {
	name, id, container, ctrID string
}

func (p kubePod) exec(t *testing.T, args ...string) result {
	cmd := exec.Command("crictl", append([]string{"--runtime-endpoint", kubeEndpoint, "exec", p.ctrID}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		r.code = -1
		r.stderr += err.Error()
	}
	return r
}

// runKubePod runs a pod named name whose container serves the workload
// with mib MiB of memory, under handler, and removes it (and every pod
// forked from it) when the test ends.
func runKubePod(t *testing.T, name, handler string, mib int) kubePod {
	t.Helper()
	p := runKubePodOf(t, name, handler, []string{"/workload", "serve", "--mem-mib", fmt.Sprint(mib)}, true)
	workloadCmd(t, p.exec, "probe")
	return p
}

// runKubePodOf runs a pod whose container runs command, with the workload
// binary mounted at /workload if withWorkload.
func runKubePodOf(t *testing.T, name, handler string, command []string, withWorkload bool) kubePod {
	t.Helper()
	dir := t.TempDir()
	uid := fmt.Sprintf("uid-%s-%d", name, time.Now().UnixNano())
	logs := filepath.Join("/var/log/pods", "default_"+name+"_"+uid)
	pod := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid},
		"hostname": name, "log_directory": logs,
		"labels": map[string]any{"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid, "io.kubernetes.pod.namespace": "default"},
		"linux":  map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1}}},
	}
	ctr := map[string]any{
		"metadata": map[string]any{"name": "main"},
		"image":    map[string]any{"image": kubeBusybox},
		"command":  command,
		"log_path": "main/0.log",
		"labels":   map[string]any{"io.kubernetes.pod.name": name, "io.kubernetes.container.name": "main"},
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1}}},
	}
	if withWorkload {
		ctr["mounts"] = []map[string]any{{"container_path": "/workload", "host_path": workloadBin(), "readonly": true}}
	}
	podFile, ctrFile := filepath.Join(dir, "pod.json"), filepath.Join(dir, "ctr.json")
	for path, v := range map[string]any{podFile: pod, ctrFile: ctr} {
		b, _ := json.Marshal(v)
		os.WriteFile(path, b, 0o600)
	}
	os.MkdirAll(logs, 0o755)
	p := kubePod{name: name, container: "main"}
	p.id = crictl(t, "runp", "--runtime", handler, podFile)
	t.Cleanup(func() { removeKubePods(t, p.id); os.RemoveAll(logs) })
	p.ctrID = crictl(t, "create", p.id, ctrFile, podFile)
	crictl(t, "start", p.ctrID)
	return p
}

// removeKubePods removes pods by ID, and every pod forked from their
// containers.
func removeKubePods(t *testing.T, ids ...string) {
	for _, id := range ids {
		ctrs, _ := crictlTry("ps", "-a", "-q", "--pod", id)
		for _, c := range strings.Fields(ctrs) {
			forked, _ := crictlTry("pods", "-q", "--label", kubefork.LabelForkedFrom+"="+c)
			for _, f := range strings.Fields(forked) {
				crictlTry("stopp", f)
				crictlTry("rmp", "--force", f)
			}
		}
		crictlTry("stopp", id)
		crictlTry("rmp", "--force", id)
	}
}

func kubeFork(t *testing.T, args ...string) (result, *kubefork.Result) {
	t.Helper()
	// The workload holds file locks, which a fork takes only when asked.
	r := run(t, 5*time.Minute, tcloneBin(), append([]string{"kube", "fork", "--runtime-endpoint", kubeEndpoint, "--format", "json", "--file-locks"}, args...)...)
	if r.code != 0 {
		return r, nil
	}
	var res kubefork.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("tclone kube fork --format json: %v: %s", err, r.stdout)
	}
	return r, &res
}

// requireNoKubeLeftovers checks that no pod of fork call remains, and
// nothing of tclone's.
func requireNoKubeLeftovers(t *testing.T, call string) {
	t.Helper()
	if call != "" {
		if left, _ := crictlTry("pods", "-q", "--label", kubefork.LabelCall+"="+call); left != "" {
			t.Errorf("pods of fork call %s left: %s", call, left)
		}
	}
	requireNoLeftovers(t)
	if m, _ := filepath.Glob(filepath.Join(hostStore.IntentsDir(), "*")); len(m) > 0 {
		t.Errorf("fork intents left: %v", m)
	}
}

// A pod's container forked through containerd's CRI into two new pods:
// each sibling continues from the fork instant (its counter, its memory,
// a file written before the fork) in a pod of its own (name, hostname, IP),
// the source runs on, and the plan is gone once both are up.
func TestKubeForkPod(t *testing.T) {
	requireKube(t)
	requireTwins(t)
	src := runKubePod(t, uniqueName("kube"), "tclone", 64)
	if r := src.exec(t, "sh", "-c", "echo before-fork > /tmp/marker"); r.code != 0 {
		t.Fatalf("writing the marker: %s", r.stderr)
	}
	before := workloadCmd(t, src.exec, "probe", "--hash", "--reset-gap")
	r, res := kubeFork(t, "--count", "2", src.name)
	if res == nil {
		t.Fatalf("tclone kube fork: exit %d: %s", r.code, r.stderr)
	}
	if res.Source.ContainerID != src.ctrID || len(res.Siblings) != 2 {
		t.Fatalf("result: %+v", res)
	}
	t.Logf("checkpoint %.0f ms (capture held the source %.0f ms, memory %s), total %.0f ms",
		res.CheckpointMs, res.CapturePauseMs, res.Memory, res.TotalMs)
	// containerd's pause around its checkpoint is the fork's own, which
	// tclone leaves running (plan.Store.ClaimCallerPause): the capture
	// holds a running source, and --memory auto takes twins of it, as
	// for a Podman source on this host.
	if res.Memory != "twin" {
		t.Errorf("the capture's memory is %q, want twin (--memory auto of a running source)", res.Memory)
	}
	ips := map[string]string{res.Source.IP: src.name}
	for i, s := range res.Siblings {
		if want := fmt.Sprintf("%s-fork-%d", src.name, i+1); s.Name != want {
			t.Errorf("sibling %d is %s, want %s", i, s.Name, want)
		}
		sib := kubePod{name: s.Name, id: s.PodID, container: "main", ctrID: s.ContainerID}
		got := workloadCmd(t, sib.exec, "probe", "--hash")
		if got.MemSHA256 != before.MemSHA256 || !got.MemVerified {
			t.Errorf("%s: memory %s (verified %v), the source's at the fork was %s", s.Name, got.MemSHA256, got.MemVerified, before.MemSHA256)
		}
		if got.Counter < before.Counter {
			t.Errorf("%s: counter %d, below the source's %d before the fork", s.Name, got.Counter, before.Counter)
		}
		if got.Hostname != s.Name {
			t.Errorf("%s: its processes see hostname %q, want the pod's", s.Name, got.Hostname)
		}
		if out := sib.exec(t, "cat", "/tmp/marker"); strings.TrimSpace(out.stdout) != "before-fork" {
			t.Errorf("%s: /tmp/marker %q (%s), want the file written before the fork", s.Name, out.stdout, out.stderr)
		}
		if s.IP == "" || ips[s.IP] != "" {
			t.Errorf("%s: IP %q, not one of its own (%v)", s.Name, s.IP, ips)
		}
		ips[s.IP] = s.Name
		var pi struct {
			Info struct {
				Config struct {
					Labels map[string]string `json:"labels"`
				} `json:"config"`
			} `json:"info"`
		}
		json.Unmarshal([]byte(crictl(t, "inspectp", "-o", "json", s.PodID)), &pi)
		if pi.Info.Config.Labels[kubefork.LabelForkedFrom] != src.ctrID || pi.Info.Config.Labels["io.kubernetes.pod.name"] != s.Name {
			t.Errorf("%s: labels %v", s.Name, pi.Info.Config.Labels)
		}
	}
	after := workloadCmd(t, src.exec, "probe", "--hash")
	// Only tclone's capture held the source, not containerd's whole
	// checkpoint call.
	t.Logf("the source's 1 ms ticker saw a pause of %.0f ms", after.MaxGapMs)
	if after.Counter <= before.Counter || after.MemSHA256 != before.MemSHA256 {
		t.Errorf("the source: counter %d after %d, memory changed %v", after.Counter, before.Counter, after.MemSHA256 != before.MemSHA256)
	}
	if state := crictl(t, "inspect", "-o", "go-template", "--template", "{{.status.state}}", src.ctrID); state != "CONTAINER_RUNNING" {
		t.Errorf("the source is %s after the fork (containerd pauses it for the checkpoint, and must resume it)", state)
	}
	requireNoKubeLeftovers(t, "")
}

// A fork that cannot finish removes every pod it made and its plan; the
// source runs on. Here each sibling has no time to be made, then the last
// one's restore fails.
func TestKubeForkAllOrNothing(t *testing.T) {
	requireKube(t)
	src := runKubePod(t, uniqueName("kubeaon"), "tclone", 16)
	r, _ := kubeFork(t, "--count", "3", "--ready-timeout", "1ms", src.name)
	if r.code == 0 {
		t.Fatal("a fork whose siblings could not be made within 1ms succeeded")
	}
	// It failed making siblings, after the capture: the plan it made, and
	// any pod begun, must be gone.
	if !strings.Contains(r.stderr, "sibling pod") {
		t.Fatalf("the fork failed before its siblings (so nothing was rolled back): %s", r.stderr)
	}
	if left, _ := crictlTry("pods", "-q", "--label", kubefork.LabelForkedFrom+"="+src.ctrID); left != "" {
		t.Errorf("pods of the failed fork left: %s", left)
	}
	requireNoKubeLeftovers(t, "")
	if got := workloadCmd(t, src.exec, "probe"); len(got.Errors) > 0 {
		t.Errorf("the source after a failed fork: %v", got.Errors)
	}

	// The third sibling's restore fails, after the first two run and all
	// three pods were made: every one goes. The pods are made as soon as
	// the capture is done, before the CRI's checkpoint call returns (here
	// it returns a second late, through crictl).
	real, err := exec.LookPath("crictl")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wrapper, count, times := filepath.Join(dir, "crictl"), filepath.Join(dir, "creates"), filepath.Join(dir, "times")
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
	case "$a" in
	runp) echo "runp $(date +%%s%%N)" >>%[3]s ;;
	checkpoint)
		%[2]s "$@"; status=$?
		sleep 1
		echo "checkpoint-returned $(date +%%s%%N)" >>%[3]s
		exit $status ;;
	create)
		n=$(( $(cat %[1]s 2>/dev/null || echo 0) + 1 ))
		echo $n >%[1]s
		if [ $n -ge 3 ]; then echo 'level=fatal msg="injected: the third restore fails"' >&2; exit 1; fi ;;
	esac
done
exec %[2]s "$@"
`, count, real, times)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r, _ = kubeFork(t, "--count", "3", "--crictl", wrapper, src.name)
	if r.code == 0 || !strings.Contains(r.stderr, "injected: the third restore fails") {
		t.Fatalf("a fork whose third restore fails: exit %d: %s", r.code, r.stderr)
	}
	if n, _ := os.ReadFile(count); strings.TrimSpace(string(n)) != "3" {
		t.Fatalf("%q restores asked for, want 3 (two made, the third failed)", n)
	}
	var firstRunp, returned int64
	log, _ := os.ReadFile(times)
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		var what string
		var at int64
		fmt.Sscan(line, &what, &at)
		switch {
		case what == "runp" && firstRunp == 0:
			firstRunp = at
		case what == "checkpoint-returned":
			returned = at
		}
	}
	if firstRunp == 0 || returned == 0 || firstRunp >= returned {
		t.Errorf("the first sibling pod was begun at %d, the checkpoint call returned at %d: the pods must be made while it ends (%s)", firstRunp, returned, log)
	}
	if left, _ := crictlTry("pods", "-q", "--label", kubefork.LabelForkedFrom+"="+src.ctrID); left != "" {
		t.Errorf("pods of the failed fork left: %s", left)
	}
	requireNoKubeLeftovers(t, "")
	if got := workloadCmd(t, src.exec, "probe"); len(got.Errors) > 0 {
		t.Errorf("the source after a failed fork: %v", got.Errors)
	}
}

// What a fork refuses, before it touches anything: a pod of another
// runtime class, a pod that does not exist, a name taken, a bad count.
func TestKubeForkRefusals(t *testing.T) {
	requireKube(t)
	src := runKubePod(t, uniqueName("kuberef"), "tclone", 16)
	other := runKubePod(t, uniqueName("kuberunc"), "runc", 16)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{other.name}, "not run by tclone"},
		{[]string{"no-such-pod"}, "no ready pod no-such-pod"},
		{[]string{"--name", src.name, src.name}, "exists"},
		{[]string{"--count", "0", src.name}, "--count 0"},
		{[]string{"--tcp-established", src.name}, "--tcp-established"},
		{[]string{src.name + "/nope"}, "no running container nope"},
	}
	for _, c := range cases {
		r, _ := kubeFork(t, c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("tclone kube fork %v: exit %d, stderr %q; want a refusal saying %q", c.args, r.code, r.stderr, c.want)
		}
	}
	requireNoKubeLeftovers(t, "")
}

// An ordinary CRI checkpoint of a tclone pod (the kubelet's checkpoint API
// asks for exactly this) is a portable checkpoint, not a fork plan, and
// containerd restores it into a new pod as it would runc's. (containerd's
// CRI checkpoint takes no file locks: the container holds none.)
func TestKubeOrdinaryCheckpointRestores(t *testing.T) {
	requireKube(t)
	src := runKubePodOf(t, uniqueName("kubecp"), "tclone", []string{"sh", "-c", counterScript}, false)
	before := kubeCounter(t, src)
	archive := filepath.Join(t.TempDir(), "checkpoint.tar")
	crictl(t, "checkpoint", "--export", archive, src.ctrID)
	names, err := exec.Command("tar", "tf", archive).Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(names), "tclone-plan.json") || !strings.Contains(string(names), "checkpoint/pages-") {
		t.Fatalf("an ordinary CRI checkpoint is not a portable one: %s", names)
	}
	restored := restoreKubePod(t, uniqueName("kuberest"), archive)
	if got := kubeCounter(t, restored); got < before {
		t.Errorf("the restored pod's counter is %d, below the source's %d before the checkpoint", got, before)
	}
	if after := kubeCounter(t, src); after <= before {
		t.Errorf("the source's counter stopped at %d after its checkpoint", after)
	}
	requireNoKubeLeftovers(t, "")
}

// A pod's container checkpointed into a checkpoint image (tclone kube
// checkpoint --image --push) travels through a registry: the node's copy
// removed and the image pulled again, as another node's kubelet would pull
// it, a container created with it as its image in a new pod starts
// restored by containerd's CRI, from the checkpoint instant on. What cannot
// be an image is refused, and leaves none.
func TestKubeCheckpointImage(t *testing.T) {
	requireKube(t)
	registry := startRegistry(t)
	src := runKubePodOf(t, uniqueName("kubeimg"), "tclone", []string{"sh", "-c", counterScript}, false)
	if r := src.exec(t, "sh", "-c", "echo before > /tmp/marker"); r.code != 0 {
		t.Fatalf("writing the marker: %s", r.stderr)
	}
	before := kubeCounter(t, src)
	ref := registry + "/" + uniqueName("ckpt") + ":v1"
	t.Cleanup(func() { crictlTry("rmi", ref) })
	kubeCheckpoint := func(args ...string) result {
		return run(t, 5*time.Minute, tcloneBin(), append([]string{"kube", "checkpoint", "--runtime-endpoint", kubeEndpoint}, args...)...)
	}
	r := kubeCheckpoint("--image", ref, "--push", "--tls-verify=false", "--format", "json", src.name)
	if r.code != 0 {
		t.Fatalf("tclone kube checkpoint: exit %d: %s", r.code, r.stderr)
	}
	var res kubefork.ImageResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("tclone kube checkpoint --format json: %v: %s", err, r.stdout)
	}
	if res.Image.Name != ref || !res.Pushed || res.Image.LayerBytes <= 0 || res.Source.ContainerID != src.ctrID {
		t.Fatalf("result %+v", res)
	}
	t.Logf("checkpoint %.0f ms, image %.0f ms (%d bytes), push %.0f ms", res.CheckpointMs, res.ImageMs, res.Image.LayerBytes, res.PushMs)
	// The registry serves it, under the digest the call gave.
	repo, tag, _ := strings.Cut(strings.TrimPrefix(ref, registry+"/"), ":")
	req, _ := http.NewRequest(http.MethodHead, "http://"+registry+"/v2/"+repo+"/manifests/"+tag, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Docker-Content-Digest"); resp.StatusCode != http.StatusOK || got != res.Image.Digest {
		t.Fatalf("the registry's %s: %s, digest %s; want %s", ref, resp.Status, got, res.Image.Digest)
	}
	// This node restores from the copy imported into its containerd.
	local := restoreKubePod(t, uniqueName("kubeimglocal"), ref)
	if got := kubeCounter(t, local); got < before {
		t.Errorf("the pod restored from the node's copy: counter %d, below the source's %d before the checkpoint", got, before)
	}
	removeKubePods(t, local.id)
	// Another node has only the registry's copy.
	crictl(t, "rmi", ref)
	crictl(t, "pull", ref)
	restored := restoreKubePod(t, uniqueName("kubeimgrest"), ref)
	if got := kubeCounter(t, restored); got < before {
		t.Errorf("the restored pod's counter is %d, below the source's %d before the checkpoint", got, before)
	}
	if out := restored.exec(t, "cat", "/tmp/marker"); strings.TrimSpace(out.stdout) != "before" {
		t.Errorf("the restored pod's /tmp/marker is %q (%s), want the file written before the checkpoint", out.stdout, out.stderr)
	}
	if after := kubeCounter(t, src); after <= before {
		t.Errorf("the source's counter stopped at %d after its checkpoint", after)
	}

	// Refusals, each before anything is made.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", ref, src.name}, "exists on this node"},
		{[]string{"--image", "localhost:5000/Upper", src.name}, "image name"},
		{[]string{"--image", registry + "/" + uniqueName("none"), "no-such-pod"}, "no ready pod no-such-pod"},
		{[]string{"--image", registry + "/" + uniqueName("none"), "--runtime-endpoint", "tcp://127.0.0.1:1", src.name}, "unix:///"},
	} {
		r := kubeCheckpoint(c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("tclone kube checkpoint %v: exit %d, stderr %q; want a refusal saying %q", c.args, r.code, r.stderr, c.want)
		}
	}
	// A push that fails leaves no image on the node.
	unreachable := fmt.Sprintf("127.0.0.1:%d/%s:v1", freePort(t), uniqueName("nowhere"))
	if r := kubeCheckpoint("--image", unreachable, "--push", "--tls-verify=false", src.name); r.code == 0 || !strings.Contains(r.stderr, "ctr images push") {
		t.Errorf("a push to nowhere: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := crictlTry("inspecti", unreachable); err == nil {
		t.Errorf("the image of a failed push is left on the node")
		crictlTry("rmi", unreachable)
	}
	if m, _ := filepath.Glob(filepath.Join(hostStore.TempDir(), "tclone-image-*")); len(m) > 0 {
		t.Errorf("temporary directories left: %v", m)
	}
	requireNoKubeLeftovers(t, "")
}

// kubeCounter reads the counter counterScript keeps in pod p's container.
func kubeCounter(t *testing.T, p kubePod) int {
	t.Helper()
	var n int
	eventually(t, 30*time.Second, "the counter of "+p.name, func() error {
		r := p.exec(t, "cat", "/tmp/c")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		_, err := fmt.Sscan(r.stdout, &n)
		return err
	})
	return n
}

// restoreKubePod runs a pod named name whose container containerd
// restores from archive.
func restoreKubePod(t *testing.T, name, archive string) kubePod {
	t.Helper()
	dir := t.TempDir()
	uid := fmt.Sprintf("uid-%s", name)
	pod := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid},
		"hostname": name, "linux": map[string]any{},
	}
	ctr := map[string]any{
		"metadata": map[string]any{"name": "main"},
		"image":    map[string]any{"image": archive},
		// containerd asks for a command; the restore runs none.
		"command": []string{"sh"},
		"linux":   map[string]any{},
	}
	podFile, ctrFile := filepath.Join(dir, "pod.json"), filepath.Join(dir, "ctr.json")
	for path, v := range map[string]any{podFile: pod, ctrFile: ctr} {
		b, _ := json.Marshal(v)
		os.WriteFile(path, b, 0o600)
	}
	p := kubePod{name: name, container: "main"}
	p.id = crictl(t, "runp", "--runtime", "tclone", podFile)
	t.Cleanup(func() { removeKubePods(t, p.id) })
	p.ctrID = crictl(t, "create", p.id, ctrFile, podFile)
	crictl(t, "start", p.ctrID)
	return p
}

// kill -9 of a fork client once it has made a sibling pod: the next
// collection (tclone gc) removes every pod the call made and its plan, and
// the source runs on.
func TestKubeForkKilledClient(t *testing.T) {
	requireKube(t)
	src := runKubePod(t, uniqueName("kubekill"), "tclone", 16)
	cmd := exec.Command(tcloneBin(), "kube", "fork", "--runtime-endpoint", kubeEndpoint, "--file-locks", "--count", "3", src.name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// The first sibling pod is the sign the call is under way.
	made := false
	for deadline := time.Now().Add(2 * time.Minute); !made && time.Now().Before(deadline); {
		select {
		case err := <-done:
			t.Fatalf("the fork ended before it could be killed (%v): %s", err, stderr.String())
		default:
		}
		out, _ := crictlTry("pods", "-q", "--label", kubefork.LabelForkedFrom+"="+src.ctrID)
		made = out != ""
		if !made {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !made {
		t.Fatalf("no sibling pod appeared: %s", stderr.String())
	}
	cmd.Process.Kill()
	<-done
	eventually(t, 2*time.Minute, "the killed fork's pods removed by tclone gc", func() error {
		if g := run(t, 2*time.Minute, tcloneBin(), "gc"); g.code != 0 {
			return fmt.Errorf("tclone gc: exit %d: %s", g.code, g.stderr)
		}
		if left, _ := crictlTry("pods", "-q", "--label", kubefork.LabelForkedFrom+"="+src.ctrID); left != "" {
			return fmt.Errorf("pods left: %s", strings.ReplaceAll(left, "\n", " "))
		}
		return nil
	})
	requireNoKubeLeftovers(t, "")
	if got := workloadCmd(t, src.exec, "probe"); len(got.Errors) > 0 {
		t.Errorf("the source after a killed fork: %v", got.Errors)
	}
}
