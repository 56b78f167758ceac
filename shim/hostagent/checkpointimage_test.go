package hostagent

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestCriuVersionNumber(t *testing.T) {
	for in, want := range map[string]string{"4.2.1": "40201", "4.2": "40200", "3.19.0": "31900", " 4.1.1\n": "40101", "": "0"} {
		if got := criuVersionNumber(in); got != want {
			t.Errorf("criuVersionNumber(%q) = %s, want %s", in, got, want)
		}
	}
}

// The CRIU images go where Podman's restore reads them; the plan's other
// files into tclone's directory.
func TestImagePlanFile(t *testing.T) {
	for rel, want := range map[string]string{
		"images/pages-1.img": "/l/checkpoint/pages-1.img",
		"images/sub/x":       "/l/checkpoint/sub/x",
		"work/dump.log":      "/l/tclone/plan/work/dump.log",
		"imagesx":            "/l/tclone/plan/imagesx",
	} {
		if got := imagePlanFile("/l", rel); got != want {
			t.Errorf("imagePlanFile(%q) = %s, want %s", rel, got, want)
		}
	}
}

// The configuration is Podman's own but for the runtime, left to the
// restoring host; the checkpoint directory of the archive (a plan
// reference) is not copied.
func TestCopyConfiguration(t *testing.T) {
	cfgData, err := os.ReadFile("testdata/podman-5.4-config.dump")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	json.Unmarshal(cfgData, &cfg)
	cfg["runtime"] = "tclone"
	cfg["namedVolumes"] = []map[string]any{{"volumeName": "data", "dest": "/data"}}
	cfgData, _ = json.Marshal(cfg)
	archive := filepath.Join(t.TempDir(), "a.tar")
	f, _ := os.Create(archive)
	tw := tar.NewWriter(f)
	for name, data := range map[string][]byte{configDump: cfgData, specDump: []byte(`{"ociVersion":"1.0.0"}`), networkStatus: []byte(`{}`), planRef: []byte(`{}`)} {
		writeTarFile(tw, name, data)
	}
	tw.Close()
	f.Close()

	dir := t.TempDir()
	got, err := copyConfiguration(archive, dir)
	if err != nil {
		t.Fatal(err)
	}
	if names := got.volumeNames(); len(names) != 1 || names[0] != "data" {
		t.Errorf("volumes %v", names)
	}
	var written map[string]any
	data, _ := os.ReadFile(filepath.Join(dir, configDump))
	json.Unmarshal(data, &written)
	if _, ok := written["runtime"]; ok || written["name"] != cfg["name"] {
		t.Errorf("config.dump written: runtime %v, name %v", written["runtime"], written["name"])
	}
	for _, name := range []string{specDump, networkStatus} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint")); err == nil {
		t.Error("the archive's plan reference was copied")
	}
}
