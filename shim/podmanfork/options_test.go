package podmanfork

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/plan"
)

func TestParseReady(t *testing.T) {
	good := map[string]Ready{
		"":                {Kind: ReadyRunning},
		"running":         {Kind: ReadyRunning},
		"exec":            {Kind: ReadyExec},
		"tcp:8080":        {Kind: ReadyTCP, Port: 8080},
		"http:80/healthz": {Kind: ReadyHTTP, Port: 80, Path: "/healthz"},
		"http:80":         {Kind: ReadyHTTP, Port: 80, Path: "/"},
	}
	for in, want := range good {
		got, err := ParseReady(in)
		if err != nil || got != want {
			t.Errorf("ParseReady(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"tcp", "tcp:0", "tcp:70000", "tcp:80/x", "udp:53", "http:", "ready"} {
		if _, err := ParseReady(bad); err == nil {
			t.Errorf("ParseReady(%q) accepted", bad)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels([]string{"a=1", "b=x=y", "c="})
	if err != nil || got["a"] != "1" || got["b"] != "x=y" || got["c"] != "" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range [][]string{{"novalue"}, {"=x"}, {LabelForkedFrom + "=x"}} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestNormalize(t *testing.T) {
	o := Options{}
	if err := o.normalize(); err != nil || o.Count != 1 || o.Identity != plan.IdentityUnique || o.Ready.Kind != ReadyRunning || o.ReadyTimeout == 0 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range []Options{
		{Count: 33}, {Count: -1}, {Count: 2, Names: []string{"a"}},
		{TCPEstablished: true}, {TCPEstablished: true, TCPClose: true}, {Identity: "clone"},
	} {
		if err := bad.normalize(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	o = Options{TCPClose: true}
	if err := o.normalize(); err != nil {
		t.Fatalf("--tcp-close, the default said out loud, refused: %v", err)
	}
	o = Options{Names: []string{"a", "b"}}
	if err := o.normalize(); err != nil || o.Count != 2 {
		t.Fatalf("names imply the count: %+v %v", o, err)
	}
}

// Keeping the source's connections in a sibling with its own IP would let
// it talk to the source's peers as the source: refused, saying why and what
// the default does.
func TestTCPEstablishedRefused(t *testing.T) {
	o := Options{TCPEstablished: true}
	err := o.normalize()
	if err == nil {
		t.Fatal("--tcp-established accepted")
	}
	for _, want := range []string{"own IP", "source's address and sequence numbers", "closes the siblings' copies"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

func TestHostnameFor(t *testing.T) {
	for in, want := range map[string]string{
		"ws-fork-1":    "ws-fork-1",
		"my_ws.fork_2": "my-ws-fork-2",
		"__":           "fork",
		string(make([]byte, 0)) + "x" + string(bytes.Repeat([]byte("y"), 80)): "x" + string(bytes.Repeat([]byte("y"), 62)),
	} {
		if got := hostnameFor(in); got != want {
			t.Errorf("hostnameFor(%q) = %q, want %q", in, got, want)
		}
	}
}

// The per-sibling archive changes only the configuration: hostname, labels
// and published ports; every other file passes through byte for byte.
func TestWriteSiblingArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.tar")
	config := map[string]any{
		"name": "ws", "labels": map[string]any{"keep": "me"},
		"newPortMappings": []any{map[string]any{"host_port": 8080}},
		"spec":            map[string]any{"hostname": "abc"}, "unknownField": 7,
	}
	spec := map[string]any{"hostname": "abc", "process": map[string]any{"cwd": "/"}}
	ref := plan.Reference{PlanID: "p1", PlanDir: "/run/tclone/plans/p1"}
	files := map[string]any{"config.dump": config, "spec.dump": spec, "checkpoint/" + plan.ReferenceFile: ref}
	writeTar(t, src, files, map[string]string{"checkpoint/inventory.img": "\x01\x02binary"})

	got, err := readReference(src)
	if err != nil || got.PlanDir != ref.PlanDir {
		t.Fatalf("reference %+v %v", got, err)
	}
	dst := filepath.Join(dir, "sib.tar")
	err = writeSiblingArchive(src, dst, siblingEdit{Hostname: "ws-fork-1", Labels: map[string]string{LabelForkedFrom: "id"}, DropPorts: true})
	if err != nil {
		t.Fatal(err)
	}
	out := readTar(t, dst)
	var cfg, sp map[string]any
	json.Unmarshal(out["config.dump"], &cfg)
	json.Unmarshal(out["spec.dump"], &sp)
	labels := cfg["labels"].(map[string]any)
	if labels["keep"] != "me" || labels[LabelForkedFrom] != "id" {
		t.Errorf("labels %v", labels)
	}
	if _, ok := cfg["newPortMappings"]; ok {
		t.Error("the source's published ports were kept")
	}
	if cfg["spec"].(map[string]any)["hostname"] != "ws-fork-1" || sp["hostname"] != "ws-fork-1" {
		t.Errorf("hostname not set: %v / %v", cfg["spec"], sp["hostname"])
	}
	if cfg["unknownField"] != float64(7) || sp["process"] == nil {
		t.Error("unknown configuration fields were dropped")
	}
	if string(out["checkpoint/inventory.img"]) != "\x01\x02binary" {
		t.Errorf("inventory changed: %q", out["checkpoint/inventory.img"])
	}
}

func TestReadReferenceOfOrdinaryCheckpoint(t *testing.T) {
	src := filepath.Join(t.TempDir(), "plain.tar")
	writeTar(t, src, map[string]any{"config.dump": map[string]any{}}, map[string]string{"checkpoint/pages-1.img": "x"})
	if _, err := readReference(src); err == nil {
		t.Fatal("an ordinary checkpoint was taken for a fork plan")
	}
}

func writeTar(t *testing.T, path string, jsonFiles map[string]any, raw map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, data []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	tw.WriteHeader(&tar.Header{Name: "checkpoint/", Mode: 0o700, Typeflag: tar.TypeDir})
	for name, v := range jsonFiles {
		data, _ := json.Marshal(v)
		add(name, data)
	}
	for name, s := range raw {
		add(name, []byte(s))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = data
	}
}
