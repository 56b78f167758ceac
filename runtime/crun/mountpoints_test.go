package crun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A bind mount inside another, listed before it or after, gets its
// mountpoint in the outer source, a file or a directory after its own
// source; one that is there (a fifo, one behind a link) is left unopened; a
// link planted on the way is not followed, and the mounts after it are
// still seen to; mounts not inside a bind mount get nothing.
func TestMakeNestedMountpoints(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string, isDir bool) string {
		p = filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if isDir {
			os.MkdirAll(p, 0o755)
		} else {
			os.WriteFile(p, []byte("s"), 0o600)
		}
		return p
	}
	secrets := mk("sib/run/secrets", true) // the sibling's, still empty
	secret := mk("store/secrets/tsec", false)
	cache := mk("store/cache", true)
	outside := mk("outside", true)
	linked := mk("sib/linked", true)
	os.Symlink(outside, filepath.Join(linked, "evil"))
	bundle := mk("bundle", true)
	config := `{"ociVersion":"1.2.0","mounts":[` +
		`{"destination":"/proc","type":"proc","source":"proc"},` +
		`{"destination":"/l","type":"bind","source":"` + linked + `","options":["bind"]},` +
		`{"destination":"/l/evil/f","type":"bind","source":"` + secret + `","options":["bind"]},` +
		`{"destination":"/run/secrets/tsec","type":"bind","source":"` + secret + `","options":["bind","rprivate"]},` +
		`{"destination":"/run/secrets","type":"bind","source":"` + secrets + `","options":["bind","rprivate"]},` +
		`{"destination":"/run/secrets/deep/cache","type":"bind","source":"` + cache + `","options":["rbind"]},` +
		`{"destination":"/proc/x","type":"bind","source":"` + secret + `","options":["bind"]}]}`
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(config), 0o600)
	err := PrepareRestore(bundle)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a mountpoint through a planted link: %v, want an error naming the link", err)
	}
	if st, err := os.Stat(filepath.Join(secrets, "tsec")); err != nil || !st.Mode().IsRegular() || st.Size() != 0 {
		t.Errorf("the secret's mountpoint: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(secrets, "deep", "cache")); err != nil || !st.IsDir() {
		t.Errorf("the nested directory's mountpoint: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err == nil {
		t.Error("a mountpoint was made through a link, outside the outer source")
	}
	// There already, even as a fifo or behind a link: left as it is,
	// never opened, and no error.
	fifo := mk("sib/fifo", true)
	if err := unix.Mkfifo(filepath.Join(fifo, "p"), 0o600); err != nil {
		t.Fatal(err)
	}
	real := mk("sib/real/x", false)
	os.Symlink("real", filepath.Join(filepath.Dir(filepath.Dir(real)), "sub"))
	there := `{"ociVersion":"1.2.0","mounts":[` +
		`{"destination":"/f","type":"bind","source":"` + fifo + `","options":["bind"]},` +
		`{"destination":"/f/p","type":"bind","source":"` + secret + `","options":["bind"]},` +
		`{"destination":"/s","type":"bind","source":"` + filepath.Dir(filepath.Dir(real)) + `","options":["bind"]},` +
		`{"destination":"/s/sub/x","type":"bind","source":"` + secret + `","options":["bind"]}]}`
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(there), 0o600)
	done := make(chan error, 1)
	go func() { done <- PrepareRestore(bundle) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("mountpoints there already: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PrepareRestore blocked on a fifo that was there")
	}
	// Made already: left as it is, and no error.
	os.WriteFile(filepath.Join(secrets, "tsec"), []byte("kept"), 0o600)
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(strings.Replace(config, `{"destination":"/l/evil/f","type":"bind","source":"`+secret+`","options":["bind"]},`, "", 1)), 0o600)
	if err := PrepareRestore(bundle); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(secrets, "tsec")); string(b) != "kept" {
		t.Errorf("an existing mountpoint was changed: %q", b)
	}
}
