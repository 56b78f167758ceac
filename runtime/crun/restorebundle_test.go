package crun

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A bind mount's source that is a link is replaced by where it leads; other
// mounts, and every other field, are left as written; a config.json
// without such a source is not rewritten.
func TestPrepareRestore(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "bin", "catatonit")
	os.MkdirAll(filepath.Dir(real), 0o755)
	os.WriteFile(real, []byte("x"), 0o755)
	link := filepath.Join(dir, "libexec-catatonit")
	if err := os.Symlink("bin/catatonit", link); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "hosts")
	os.WriteFile(plain, nil, 0o644)
	bundle := filepath.Join(dir, "bundle")
	os.Mkdir(bundle, 0o755)
	config := `{"ociVersion":"1.2.0","x-unknown":{"kept":true},"mounts":[` +
		`{"destination":"/run/podman-init","type":"bind","source":"` + link + `","options":["bind","ro","private"]},` +
		`{"destination":"/etc/hosts","type":"bind","source":"` + plain + `","options":["bind","rprivate"]},` +
		`{"destination":"/proc","type":"proc","source":"proc"},` +
		`{"destination":"/tmp/l","type":"tmpfs","source":"` + link + `","options":["nosuid"]}]}`
	path := filepath.Join(bundle, "config.json")
	os.WriteFile(path, []byte(config), 0o600)
	if err := PrepareRestore(bundle); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Unknown map[string]bool `json:"x-unknown"`
		Mounts  []struct {
			Source string `json:"source"`
		} `json:"mounts"`
	}
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{real, plain, "proc", link}
	for i, m := range got.Mounts {
		if m.Source != want[i] {
			t.Errorf("mount %d: source %s, want %s", i, m.Source, want[i])
		}
	}
	if !got.Unknown["kept"] {
		t.Errorf("a field tclone does not know was lost: %s", data)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("config.json's mode became %v", st.Mode().Perm())
	}
	// Nothing left to resolve: the file is not written again.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	if err := PrepareRestore(bundle); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); !st.ModTime().Equal(old) {
		t.Error("a config.json with nothing to resolve was rewritten")
	}
	if err := PrepareRestore(dir); err != nil {
		t.Errorf("a bundle without config.json: %v, want it left to crun", err)
	}
}
