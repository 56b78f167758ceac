package branch

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzImport feeds arbitrary archives to the import (signature check
// waived, so the fuzzer reaches the contents): it must never panic, never
// write outside its store, and leave no branch when it fails.
func FuzzImport(f *testing.F) {
	data := pages(3, 0, 2)
	hash, packed := packedChunk(data)
	m := craftedManifest([]File{{Path: "images/pages-1.img", Mode: 0o600, Size: int64(len(data)), Chunks: []Chunk{{Hash: hash, Size: int64(len(data))}}}}, []string{RootfsTree})
	m.Plan.Rootfs = &rootfsOverlay
	tree := tarOf(&testing.T{}, []craftedEntry{{name: "./f", data: []byte("x")}})
	f.Add(archiveBytes(f, m, []craftedEntry{{name: "tclone-branch/chunks/" + hash, data: packed}, {name: "tclone-branch/trees/rootfs.tar", data: tree}}))
	f.Add([]byte("not an archive"))
	f.Fuzz(func(t *testing.T, archive []byte) {
		// On a tmpfs: a successful import syncs its filesystem, which on a
		// busy disk takes long enough to starve the fuzzer.
		root, err := os.MkdirTemp("/dev/shm", "tclone-fuzz-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(root)
		s := Store{Dir: filepath.Join(root, "store")}
		_, err = s.ImportFrom(bytes.NewReader(archive), "fuzz", ImportOptions{InsecureUnsigned: true})
		if err != nil {
			if infos, _ := s.List(); len(infos) != 0 {
				t.Fatalf("a failed import left %+v", infos)
			}
		}
		entries, _ := os.ReadDir(root)
		if len(entries) > 1 {
			t.Fatalf("the import wrote beside its store: %v", entries)
		}
	})
}

// FuzzManifest checks arbitrary manifests: Check never panics, and a
// manifest it accepts has only local file paths and bounded chunks.
func FuzzManifest(f *testing.F) {
	m := craftedManifest([]File{{Path: "images/x.img", Mode: 0o600, Size: 4096, Chunks: []Chunk{{Hash: sha256Hex([]byte("x")), Size: 4096}}}}, nil)
	seed, _ := json.Marshal(m)
	f.Add(seed)
	f.Add([]byte(`{"version":1,"name":"a","files":[{"path":"../x","chunks":[{"sha256":"a","size":-1}]}]}`))
	f.Fuzz(func(t *testing.T, manifest []byte) {
		var b Branch
		if json.Unmarshal(manifest, &b) != nil || b.Check() != nil {
			return
		}
		for _, file := range b.Files {
			if !filepath.IsLocal(file.Path) {
				t.Fatalf("accepted file path %q", file.Path)
			}
			for _, c := range file.Chunks {
				if len(c.Hash) != 64 || c.Size <= 0 || c.Size > maxChunkBytes {
					t.Fatalf("accepted chunk %+v", c)
				}
			}
		}
	})
}

// archiveBytes is craftArchive's archive, in memory.
func archiveBytes(tb testing.TB, m any, entries []craftedEntry) []byte {
	t, ok := tb.(*testing.T)
	if !ok {
		t = &testing.T{}
	}
	data, err := os.ReadFile(craftArchiveIn(tb.TempDir(), t, m, entries))
	if err != nil {
		tb.Fatal(err)
	}
	return data
}
