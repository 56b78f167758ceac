package branch

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// An archive is imported only when a trusted key signed it; an unsigned or
// unknown one only with InsecureUnsigned; a changed one never.
func TestImportTrust(t *testing.T) {
	src := Store{Dir: t.TempDir()}
	createWith(t, src, "x", map[string][]byte{"images/pages-1.img": pages(4, 0, 8)}, func(string) {}, func(*Branch) {})
	key, stranger := testKey(t), testKey(t)
	file := filepath.Join(t.TempDir(), "x.tar.zst")
	if _, err := src.Export("x", file, key); err != nil {
		t.Fatal(err)
	}
	dst := Store{Dir: t.TempDir()}
	if _, err := dst.Import(file, trusting(stranger, "", nil)); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("an archive of a key not trusted: %v", err)
	}
	if _, err := dst.Import(file, ImportOptions{}); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("an import trusting nothing: %v", err)
	}
	requireNoBranch(t, dst)
	b, err := dst.Import(file, ImportOptions{InsecureUnsigned: true})
	if err != nil || b.Imported == nil || b.Imported.Trusted || b.Imported.Key != key.Public().String() {
		t.Fatalf("--insecure-unsigned: %+v %v", b, err)
	}

	// The manifest changed after signing (a label added): refused, even
	// with InsecureUnsigned.
	changed := rewriteArchive(t, file, func(name string, data []byte) []byte {
		if name == archiveManifest {
			return bytes.Replace(data, []byte(`"name":"x"`), []byte(`"name":"x","labels":{"a":"b"}`), 1)
		}
		return data
	})
	dst2 := Store{Dir: t.TempDir()}
	if _, err := dst2.Import(changed, ImportOptions{InsecureUnsigned: true}); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("a changed manifest: %v", err)
	}
	// A tree changed after signing: its hash is not the signed index's.
	tree := rewriteArchive(t, file, func(name string, data []byte) []byte {
		if name == archiveTrees+"rootfs.tar" {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: ".", Typeflag: tar.TypeDir, Mode: 0o755})
			tw.Close()
			return append(buf.Bytes(), make([]byte, len(data)-buf.Len())...)
		}
		return data
	})
	if _, err := dst2.Import(tree, trusting(key, "", nil)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a changed tree: %v", err)
	}
	requireNoBranch(t, dst2)
}

func rewriteArchive(t *testing.T, file string, edit func(name string, data []byte) []byte) string {
	t.Helper()
	in, _ := os.Open(file)
	defer in.Close()
	zr, _ := zstd.NewReader(in)
	defer zr.Close()
	out := filepath.Join(t.TempDir(), "edited.tar.zst")
	f, _ := os.Create(out)
	zw, _ := zstd.NewWriter(f)
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		data, _ := io.ReadAll(tr)
		data = edit(h.Name, data)
		h.Size = int64(len(data))
		tw.WriteHeader(h)
		tw.Write(data)
	}
	tw.Close()
	zw.Close()
	f.Close()
	return out
}
