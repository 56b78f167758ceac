package copyfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCopy(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	os.WriteFile(src, []byte("new"), 0o644)
	os.WriteFile(dst, []byte("older and longer"), 0o644)
	// O_EXCL refuses the file there; O_TRUNC replaces it whole.
	if err := Copy(src, dst, os.O_EXCL); !errors.Is(err, os.ErrExist) {
		t.Fatalf("O_EXCL over a file: %v", err)
	}
	if err := Copy(src, dst, os.O_TRUNC); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); string(got) != "new" {
		t.Errorf("dst holds %q", got)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := From(strings.NewReader("x"), fresh, os.O_EXCL); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(fresh); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("a new file: %v, %v", st.Mode(), err)
	}
	if err := Copy(src, dst, 0); err == nil || !strings.Contains(err.Error(), "O_TRUNC") {
		t.Errorf("neither O_TRUNC nor O_EXCL: %v", err)
	}
	if got, _ := os.ReadFile(dst); string(got) != "new" {
		t.Errorf("a refused copy changed dst: %q", got)
	}
	if err := Copy(filepath.Join(dir, "missing"), filepath.Join(dir, "other"), os.O_EXCL); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("copying a missing file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed copy left its destination: %v", err)
	}
}
