package kubefork

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/plan"
)

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A kubelet-made pod's configuration, as containerd's inspectp gives it.
const kubeletPod = `{"metadata":{"name":"ws","uid":"u-1","namespace":"team","attempt":2},
 "hostname":"ws","log_directory":"/var/log/pods/team_ws_u-1",
 "labels":{"io.kubernetes.pod.name":"ws","io.kubernetes.pod.uid":"u-1","app":"agent"},
 "annotations":{"kubernetes.io/config.source":"api"},
 "port_mappings":[{"container_port":8080,"host_port":18080}],
 "dns_config":{"servers":["10.96.0.10"]},
 "linux":{"security_context":{"namespace_options":{"pid":1}}}}`

func TestSiblingPodConfig(t *testing.T) {
	src := decode(t, kubeletPod)
	got, err := siblingPodConfig(src, sibling{name: "ws-fork-1", uid: "u-2"}, "ctr-1", "call-1")
	if err != nil {
		t.Fatal(err)
	}
	meta := got["metadata"].(map[string]any)
	if meta["name"] != "ws-fork-1" || meta["uid"] != "u-2" || meta["namespace"] != "team" || meta["attempt"] != 0 {
		t.Errorf("metadata %v: want the sibling's name and UID, the source's namespace, attempt 0", meta)
	}
	if got["hostname"] != "ws-fork-1" {
		t.Errorf("hostname %v, want the sibling's name", got["hostname"])
	}
	if got["log_directory"] != "/var/log/pods/team_ws-fork-1_u-2" {
		t.Errorf("log directory %v, want the kubelet's layout for the sibling", got["log_directory"])
	}
	if _, ok := got["port_mappings"]; ok {
		t.Error("the sibling took the source's host ports")
	}
	labels := got["labels"].(map[string]any)
	want := map[string]any{"io.kubernetes.pod.name": "ws-fork-1", "io.kubernetes.pod.uid": "u-2", "app": "agent",
		LabelForkedFrom: "ctr-1", LabelCall: "call-1"}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %v, want %v", k, labels[k], v)
		}
	}
	if got["dns_config"] == nil || got["linux"] == nil || got["annotations"] == nil {
		t.Error("the source's DNS, Linux options or annotations were lost")
	}
	// The source's configuration is left as it was.
	if src["metadata"].(map[string]any)["name"] != "ws" || src["port_mappings"] == nil {
		t.Error("the source's configuration was changed")
	}
}

func TestSiblingPodConfigWithoutLabels(t *testing.T) {
	got, err := siblingPodConfig(decode(t, `{"metadata":{"name":"a","namespace":"default"}}`), sibling{name: "a-fork-1", uid: "u"}, "c", "n")
	if err != nil {
		t.Fatal(err)
	}
	labels := got["labels"].(map[string]any)
	if len(labels) != 2 || labels[LabelCall] != "n" {
		t.Errorf("labels %v: want only the fork's (no kubelet labels to rename)", labels)
	}
	if _, err := siblingPodConfig(decode(t, `{"hostname":"x"}`), sibling{name: "b"}, "c", "n"); err == nil {
		t.Error("a pod configuration without metadata was taken")
	}
}

func TestSiblingContainerConfig(t *testing.T) {
	src := decode(t, `{"metadata":{"name":"main"},"image":{"image":"localhost:5000/ws:1","user_specified_image":"ws:1"},
		"command":["sleep","inf"],"labels":{"io.kubernetes.pod.name":"ws"},"log_path":"main/0.log"}`)
	got, err := siblingContainerConfig(src, "/run/x/fork.tar", sibling{name: "ws-fork-1", uid: "u-2"}, "ctr-1", "call-1")
	if err != nil {
		t.Fatal(err)
	}
	if img := got["image"].(map[string]any); len(img) != 1 || img["image"] != "/run/x/fork.tar" {
		t.Errorf("image %v, want the checkpoint archive alone", img)
	}
	if got["command"] == nil || got["log_path"] != "main/0.log" {
		t.Error("the command (containerd needs one) or the log path was lost")
	}
	if l := got["labels"].(map[string]any); l["io.kubernetes.pod.name"] != "ws-fork-1" || l[LabelCall] != "call-1" {
		t.Errorf("labels %v", l)
	}
}

func TestSiblingNames(t *testing.T) {
	taken := map[string]bool{"ws": true, "ws-fork-1": true, "ws-fork-3": true}
	got, err := siblingNames("ws", "", 3, taken)
	if err != nil || strings.Join(got, " ") != "ws-fork-2 ws-fork-4 ws-fork-5" {
		t.Errorf("default names %v, %v: want the lowest free", got, err)
	}
	if got, _ := siblingNames("ws", "trial", 1, taken); strings.Join(got, " ") != "trial" {
		t.Errorf("--name trial: %v", got)
	}
	if got, _ := siblingNames("ws", "trial", 2, taken); strings.Join(got, " ") != "trial-1 trial-2" {
		t.Errorf("--name trial --count 2: %v", got)
	}
	if _, err := siblingNames("ws", "ws-fork-3", 1, taken); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a taken --name: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"ws", "ws-fork-1", "a.b", "0abc"} {
		if err := checkName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "WS", "-ws", "ws-", "w_s", "a..b", strings.Repeat("a", 64)} {
		if err := checkName(bad); err == nil {
			t.Errorf("%q was taken", bad)
		}
	}
}

// writeTar writes entries (name, body) as a tar file.
func writeTar(t *testing.T, path string, entries ...[2]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		tw.WriteHeader(&tar.Header{Name: e[0], Mode: 0o600, Size: int64(len(e[1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(e[1]))
	}
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	return names
}

// The archive siblings restore from keeps everything containerd reads but
// the root filesystem diff (tclone restores the fork instant's root), and
// names the plan.
func TestForkArchive(t *testing.T) {
	dir := t.TempDir()
	ref := `{"version":1,"plan_id":"p1","plan_dir":"/run/tclone/plans/p1","source_id":"c1"}`
	writeTar(t, filepath.Join(dir, "in.tar"),
		[2]string{"checkpoint/inventory.img", "inv"}, [2]string{"checkpoint/" + plan.ReferenceFile, ref},
		[2]string{"config.dump", "{}"}, [2]string{"spec.dump", "{}"}, [2]string{"status.dump", "{}"},
		[2]string{rootfsDiff, "later files"})
	got, err := forkArchive(filepath.Join(dir, "in.tar"), filepath.Join(dir, "out.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if got.PlanDir != "/run/tclone/plans/p1" || got.SourceID != "c1" {
		t.Errorf("reference %+v", got)
	}
	names := strings.Join(tarNames(t, filepath.Join(dir, "out.tar")), " ")
	if names != "checkpoint/inventory.img checkpoint/"+plan.ReferenceFile+" config.dump spec.dump status.dump" {
		t.Errorf("entries %s", names)
	}
	// The reference is copied whole, not only read.
	f, _ := os.Open(filepath.Join(dir, "out.tar"))
	defer f.Close()
	tr := tar.NewReader(f)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		if h.Name == "checkpoint/"+plan.ReferenceFile {
			var b bytes.Buffer
			b.ReadFrom(tr)
			if b.String() != ref {
				t.Errorf("reference copied as %q", b.String())
			}
		}
	}
}

// A portable checkpoint (no plan reference) is refused: its restore needs
// the diff this would drop.
func TestForkArchiveRefusesAPortableCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeTar(t, filepath.Join(dir, "in.tar"), [2]string{"checkpoint/pages-1.img", "x"}, [2]string{rootfsDiff, "y"})
	if _, err := forkArchive(filepath.Join(dir, "in.tar"), filepath.Join(dir, "out.tar")); err == nil || !strings.Contains(err.Error(), "no fork plan") {
		t.Fatalf("a checkpoint without a plan: %v", err)
	}
}

func TestLastLine(t *testing.T) {
	stderr := "time=\"x\" level=warning msg=\"Config \\\"/etc/crictl.yaml\\\" does not exist\"\n" +
		"time=\"y\" level=fatal msg=\"run pod sandbox: rpc error: code = Unknown desc = \\\"bad\\\"\"\n"
	if got := lastLine(stderr); got != `run pod sandbox: rpc error: code = Unknown desc = "bad"` {
		t.Errorf("lastLine = %q", got)
	}
}
