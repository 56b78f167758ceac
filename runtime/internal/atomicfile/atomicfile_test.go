package atomicfile

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestWriteFileReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, content := range []string{"first", "second, longer"} {
		if err := WriteFile(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			t.Fatalf("read %q, %v; want %q", got, err, content)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, %v; want 0640", st.Mode(), err)
	}
	assertOnly(t, filepath.Dir(path), "f")
}

// A failed write leaves the old file and no temporary one.
func TestWriteFileFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(path, func() {}, 0o600); err == nil {
		t.Fatal("a value JSON cannot encode was written")
	}
	// A directory in the way: the rename fails after the data was written.
	blocked := filepath.Join(dir, "d")
	os.Mkdir(blocked, 0o700)
	os.WriteFile(filepath.Join(blocked, "x"), nil, 0o600)
	if err := WriteFile(blocked, []byte("new"), 0o600); err == nil {
		t.Fatal("replaced a non-empty directory")
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("the old file became %q", got)
	}
	assertOnly(t, dir, "d", "f")
}

func TestWriteFileMissingDir(t *testing.T) {
	err := WriteFile(filepath.Join(t.TempDir(), "no", "f"), nil, 0o600)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}

// Readers racing concurrent writers only ever see whole documents.
func TestWriteJSONConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.json")
	if err := WriteJSON(path, []int{0}, 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := 1; w <= 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if err := WriteJSON(path, []int{w, i, w * i}, 0o600); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var v []int
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("a reader saw %q: %v", data, err)
		}
		select {
		case <-done:
			assertOnly(t, filepath.Dir(path), "v.json")
			return
		default:
		}
	}
}

func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "v.json")
	var v map[string]int
	if err := ReadJSON(path, &v); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
	if err := WriteJSON(path, map[string]int{"a": 1}, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(path, &v); err != nil || v["a"] != 1 {
		t.Fatalf("%v %v", v, err)
	}
	os.WriteFile(path, []byte("{"), 0o600)
	if err := ReadJSON(path, &v); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a broken file: %v", err)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if len(got) != len(names) {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
	for i := range got {
		if got[i] != names[i] {
			t.Fatalf("%s holds %v, want %v", dir, got, names)
		}
	}
}
