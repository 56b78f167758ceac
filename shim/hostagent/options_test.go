package hostagent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

func TestNormalize(t *testing.T) {
	o := podmanfork.Options{}
	if err := normalize(&o); err != nil || o.Count != 1 || o.Identity != forkopts.IdentityUnique || o.Ready.Kind != podmanfork.ReadyRunning || o.ReadyTimeout == 0 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range []podmanfork.Options{
		{Count: 33}, {Count: -1}, {Count: 2, Names: []string{"a"}},
		{Fork: forkopts.Fork{Capture: forkopts.Capture{TCP: forkopts.TCPKeep}}}, {Fork: forkopts.Fork{Identity: "clone"}},
	} {
		if err := normalize(&bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	o = podmanfork.Options{Fork: forkopts.Fork{Capture: forkopts.Capture{TCP: forkopts.TCPClose}}}
	if err := normalize(&o); err != nil {
		t.Fatalf("--tcp-close, the default said out loud, refused: %v", err)
	}
	o = podmanfork.Options{Names: []string{"a", "b"}}
	if err := normalize(&o); err != nil || o.Count != 2 {
		t.Fatalf("names imply the count: %+v %v", o, err)
	}
}

// Keeping the source's connections in a sibling with its own IP would let
// it talk to the source's peers as the source: refused, saying why and what
// the default does.
func TestTCPEstablishedRefused(t *testing.T) {
	o := podmanfork.Options{Fork: forkopts.Fork{Capture: forkopts.Capture{TCP: forkopts.TCPKeep}}}
	err := normalize(&o)
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
	err = writeSiblingArchive(src, dst, siblingEdit{Hostname: "ws-fork-1", Labels: map[string]string{podmanfork.LabelForkedFrom: "id"}, DropPorts: true})
	if err != nil {
		t.Fatal(err)
	}
	out := readTar(t, dst)
	var cfg, sp map[string]any
	json.Unmarshal(out["config.dump"], &cfg)
	json.Unmarshal(out["spec.dump"], &sp)
	labels := cfg["labels"].(map[string]any)
	if labels["keep"] != "me" || labels[podmanfork.LabelForkedFrom] != "id" {
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

// Every option is checked before anything is made.
func TestNormalizeRefuses(t *testing.T) {
	for what, o := range map[string]podmanfork.Options{
		"slash in name":       {Names: []string{"bad/x!"}},
		"space in name":       {Names: []string{"bad x"}},
		"leading dot":         {Names: []string{".x"}},
		"same name twice":     {Names: []string{"a", "a"}},
		"bad port":            {Publish: []string{"bad"}},
		"port out of range":   {Publish: []string{"70000:80"}},
		"one host port, two":  {Count: 2, Publish: []string{"8081:80"}},
		"reserved label":      {Labels: map[string]string{"io.tclone.fork-call": "x"}},
		"empty label key":     {Labels: map[string]string{"": "x"}},
		"empty hook":          {Hooks: []string{" "}},
		"negative timeout":    {ReadyTimeout: -time.Second},
		"bad readiness port":  {Ready: podmanfork.Ready{Kind: podmanfork.ReadyTCP, Port: 0}},
		"unknown readiness":   {Ready: podmanfork.Ready{Kind: "udp", Port: 53}},
		"count above maximum": {Count: podmanfork.MaxCount + 1},
	} {
		if err := normalize(&o); err == nil {
			t.Errorf("%s: %+v accepted", what, o)
		}
	}
	err := (podmanfork.Options{Names: []string{"bad x"}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "names must match [a-zA-Z0-9][a-zA-Z0-9_.-]*") {
		t.Errorf("a bad name is not refused in Podman's words: %v", err)
	}
	for _, good := range []podmanfork.Options{
		{Names: []string{"ws.fork_1-a"}}, {Publish: []string{"8080", "127.0.0.1:18080:80/udp"}},
		{Count: 3, Publish: []string{"8080"}}, {Labels: map[string]string{"task": "42"}},
	} {
		if err := good.Validate(); err != nil {
			t.Errorf("%+v refused: %v", good, err)
		}
	}
}

func TestNamer(t *testing.T) {
	held := []string{"ws", "ws-fork-1", "ws-fork-3"}
	n := &namer{base: "ws", taken: map[string]bool{}, chosen: map[int]string{}, list: func(context.Context) ([]string, error) { return held, nil }}
	ctx := context.Background()
	n.learn(ctx)
	if a, b := n.name(0), n.name(1); a != "ws-fork-2" || b != "ws-fork-4" {
		t.Fatalf("names %s %s", a, b)
	}
	if again := n.name(0); again != "ws-fork-2" {
		t.Fatalf("a name changed without a clash: %s", again)
	}
	// Another fork took ws-fork-2 first.
	held = append(held, "ws-fork-2")
	n.clash(ctx, 0)
	if got := n.name(0); got != "ws-fork-5" {
		t.Fatalf("after the clash: %s", got)
	}
	if got := n.name(1); got != "ws-fork-4" {
		t.Fatalf("sibling 2's name changed: %s", got)
	}
	given := &namer{given: []string{"x"}}
	if !strings.EqualFold(given.name(0), "x") || given.defaulted() {
		t.Fatal("a given name is not kept")
	}
}

func TestNameInUse(t *testing.T) {
	for _, msg := range []string{
		`creating container storage: the container name "ws-fork-1" is already in use by 4f1c. You have to remove that container to be able to reuse that name: that name is already in use`,
		`name "ws-fork-1" is in use: container already exists`,
	} {
		if !nameInUse(errors.New(msg)) {
			t.Errorf("not a name clash: %s", msg)
		}
	}
	for _, msg := range []string{
		`rootlessport listen tcp 0.0.0.0:18180: bind: address already in use`,
		`cannot listen on the TCP port: listen tcp4 :8080: bind: address already in use`,
	} {
		if nameInUse(errors.New(msg)) {
			t.Errorf("taken for a name clash: %s", msg)
		}
	}
}

func TestExecOutput(t *testing.T) {
	out := "crun: executable file `true` not found in $PATH: No such file or directory: OCI runtime attempted to invoke a command that was not found\n" +
		"Error: read unixpacket @->/proc/self/fd/14/attach: read: connection reset by peer\n"
	clean := cleanExecOutput(out)
	if strings.Contains(clean, "unixpacket") || strings.Contains(clean, "attach") {
		t.Fatalf("the service's attach error was kept: %q", clean)
	}
	if !commandMissing(127, clean, "true") {
		t.Fatalf("a missing command was not recognised: %q", clean)
	}
	if commandMissing(127, "sh: 1: foo: not found", "sh") {
		t.Fatal("a hook's missing command was taken for a missing shell")
	}
	if commandMissing(0, clean, "true") {
		t.Fatal("a command that ran was taken for a missing one")
	}
}

func TestExplainRestoreError(t *testing.T) {
	for msg, hint := range map[string]string{
		"IPAM error: requested ip address 10.89.77.10 is already allocated to container ID 3aae": "--ignore-static-ip",
		"requested MAC address 92:d0:c6:0a:29:33 is already in use":                              "--ignore-static-mac",
		"rootlessport listen tcp 0.0.0.0:18180: bind: address already in use":                    "--publish host port",
		`name "ws-fork-1" is in use: container already exists`:                                   "another --name",
	} {
		if got := explainRestoreError(errors.New(msg)).Error(); !strings.Contains(got, hint) {
			t.Errorf("%q: %q lacks %q", msg, got, hint)
		}
	}
}

// A branch keeps page images: a start that asks for copy-on-write memory
// is refused before the branch is even looked for, saying what to ask.
func TestStartBranchRefusesCow(t *testing.T) {
	a := New(plan.LayoutUnder(t.TempDir()))
	_, err := a.StartBranch(context.Background(), "no-such-branch", podmanfork.Options{Fork: forkopts.Fork{Memory: forkopts.MemoryCow}})
	if !errors.Is(err, podmanfork.ErrInvalidOption) || !strings.Contains(err.Error(), "--memory lazy or copy") {
		t.Fatalf("StartBranch --memory cow: %v", err)
	}
}
