package signing

import (
	"os"
	"path/filepath"
	"testing"
)

func TestHostKeyAndTrust(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "signing")
	k, err := HostKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := HostKey(dir)
	if err != nil || again.Public().String() != k.Public().String() {
		t.Fatalf("a second HostKey made another key: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "host.key")); st.Mode().Perm() != 0o600 {
		t.Errorf("host.key has mode %v", st.Mode().Perm())
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("the key directory has mode %v", st.Mode().Perm())
	}
	parsed, err := ParsePublicKey(" " + k.Public().String() + "\n")
	if err != nil || !parsed.Verify([]byte("m"), k.Sign([]byte("m"))) || parsed.Verify([]byte("n"), k.Sign([]byte("m"))) {
		t.Fatalf("parse/verify: %v", err)
	}
	if _, err := ParsePublicKey("tclone-ed25519 AAAA"); err == nil {
		t.Error("a short key was accepted")
	}

	// A key file others can read is refused.
	os.Chmod(filepath.Join(dir, "host.key"), 0o644)
	if _, err := HostKey(dir); err == nil {
		t.Error("a world-readable host key was used")
	}
	os.Chmod(filepath.Join(dir, "host.key"), 0o600)

	other, _ := HostKey(t.TempDir())
	trustDir := t.TempDir()
	os.WriteFile(filepath.Join(trustDir, "peer.pub"), []byte(other.Public().String()+"\n"), 0o644)
	tr, err := HostTrust(dir, trustDir)
	if err != nil || !tr.Trusts(k.Public()) || !tr.Trusts(other.Public()) {
		t.Fatalf("trust: %v %v", tr, err)
	}
	// A directory anyone can write into trusts nothing.
	os.Chmod(trustDir, 0o777)
	if _, err := HostTrust(dir, trustDir); err == nil {
		t.Error("a world-writable trusted-keys directory was believed")
	}
	os.Chmod(trustDir, 0o755)
	os.Chmod(filepath.Join(trustDir, "peer.pub"), 0o666)
	if _, err := HostTrust(dir, trustDir); err == nil {
		t.Error("a world-writable trusted key was believed")
	}
	if tr, err := HostTrust(dir, filepath.Join(trustDir, "none")); err != nil || tr.Trusts(other.Public()) {
		t.Errorf("no trusted-keys directory: %v", err)
	}
	if k, err := ParseTrust(filepath.Join(dir, "host.pub")); err != nil || k.String() != again.Public().String() {
		t.Errorf("--trust FILE: %v", err)
	}
}
