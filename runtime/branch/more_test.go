package branch

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
	"github.com/tclone/tclone/test/testenv"
)

func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "whiteouts are device nodes, and trusted.* xattrs need CAP_SYS_ADMIN")
}

func TestPrune(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	now := time.Now()
	mk := func(name, source string, age time.Duration, labels map[string]string) {
		createWith(t, s, name, map[string][]byte{"images/pages-1.img": pages(int64(len(name)*7+len(source)), 0, 32)},
			func(string) {}, func(b *Branch) {
				b.CreatedAt = now.Add(-age)
				b.Source = Source{ID: source + "-id", Name: source}
				b.Labels = labels
			})
	}
	mk("ws-1", "ws", 5*time.Hour, nil)
	mk("ws-2", "ws", 4*time.Hour, map[string]string{KeepLabel: "true"})
	mk("ws-3", "ws", 3*time.Hour, nil)
	mk("ws-4", "ws", time.Hour, nil)
	mk("db-1", "db", 5*time.Hour, nil)
	names := func(p *PrunePlan) []string {
		var n []string
		for _, r := range p.Remove {
			n = append(n, r.Name)
		}
		return n
	}
	if _, err := s.Prune(PruneRule{}, now, false); err == nil {
		t.Fatal("a prune with no rule was accepted")
	}
	p, err := s.Prune(PruneRule{KeepLast: 1, KeepLastSet: true}, now, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(p); !slices.Equal(got, []string{"ws-1", "ws-3"}) || !slices.Equal(p.Kept, []string{"ws-2"}) || p.Bytes == 0 {
		t.Fatalf("keep-last 1: remove %v, kept %v, %d bytes", got, p.Kept, p.Bytes)
	}
	p, _ = s.Prune(PruneRule{OlderThan: 4*time.Hour + 30*time.Minute}, now, false)
	if got := names(p); !slices.Equal(got, []string{"db-1", "ws-1"}) {
		t.Fatalf("older-than: %v", got)
	}
	p, _ = s.Prune(PruneRule{KeepLast: 0, KeepLastSet: true, Source: "db"}, now, false)
	if got := names(p); !slices.Equal(got, []string{"db-1"}) {
		t.Fatalf("source db: %v", got)
	}
	p, _ = s.Prune(PruneRule{KeepLast: 0, KeepLastSet: true, NamePrefix: "ws-", OlderThan: 2 * time.Hour}, now, false)
	if got := names(p); !slices.Equal(got, []string{"ws-1", "ws-3"}) {
		t.Fatalf("prefix and age: %v", got)
	}
	// Prune removes nothing itself.
	if infos, _ := s.List(); len(infos) != 5 {
		t.Fatalf("%d branches after prune plans", len(infos))
	}
}

func mknodWhiteout(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
}

func TestDiff(t *testing.T) {
	needRoot(t)
	s := Store{Dir: t.TempDir()}
	lower := t.TempDir()
	for _, f := range []string{"etc/config", "etc/gone", "srv/data/x", "usr/bin/tool"} {
		os.MkdirAll(filepath.Dir(filepath.Join(lower, f)), 0o755)
		os.WriteFile(filepath.Join(lower, f), []byte("image "+f), 0o644)
	}
	snapshot := &rootfs.Snapshot{Kind: rootfs.KindOverlay, LowerDirs: []string{lower}}
	tree := func(files map[string]string, whiteouts, opaque []string) func(string) {
		return func(dir string) {
			for f, content := range files {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
				os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644)
			}
			for _, w := range whiteouts {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, w)), 0o755)
				mknodWhiteout(t, filepath.Join(dir, w))
			}
			for _, o := range opaque {
				os.MkdirAll(filepath.Join(dir, o), 0o755)
				if err := unix.Setxattr(filepath.Join(dir, o), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	a := createWith(t, s, "a", map[string][]byte{"images/pages-1.img": pages(1, 0, 1024)},
		tree(map[string]string{"tmp/same": "s", "tmp/edited": "one", "etc/config": "a's config", "tmp/only-a": "x"}, nil, nil),
		func(b *Branch) {
			b.Plan.Rootfs = snapshot
			b.Plan.Tree.Tasks = []plan.Process{{Pid: 1, Comm: "sh"}, {Pid: 7, Comm: "make"}}
			b.Labels = map[string]string{"stage": "setup", "k": "v"}
		})
	b := createWith(t, s, "b", map[string][]byte{"images/pages-1.img": append(pages(1, 0, 1008), pages(9, 0, 16)...)},
		tree(map[string]string{"tmp/same": "s", "tmp/edited": "two", "tmp/only-b": "y", "usr/bin/tool": "patched"},
			[]string{"etc/gone"}, []string{"srv/data"}),
		func(b *Branch) {
			b.Plan.Rootfs = snapshot
			b.Plan.Tree.Tasks = []plan.Process{{Pid: 1, Comm: "sh"}, {Pid: 9, Comm: "pytest"}}
			b.Labels = map[string]string{"stage": "tests", "k": "v"}
			b.Parent = a.ID
		})
	d, err := s.Compare("a", "b")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range d.Files {
		got = append(got, f.Kind+" "+f.Path)
	}
	want := []string{
		"C /etc/config",   // a changed it, b has the image's
		"D /etc/gone",     // b deleted it
		"D /srv/data/x",   // b made the directory opaque
		"C /tmp/edited",   // both have it, with other contents
		"D /tmp/only-a",   // a's own file
		"A /tmp/only-b",   // b's own file
		"C /usr/bin/tool", // b changed an image file
	}
	if !slices.Equal(got, want) {
		t.Fatalf("files:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if d.Lineage.Relation != "a-ancestor-of-b" || !d.Lineage.SameSource {
		t.Errorf("lineage: %+v", d.Lineage)
	}
	if len(d.Labels) != 1 || d.Labels[0] != (LabelChange{Key: "stage", A: "setup", B: "tests"}) {
		t.Errorf("labels: %+v", d.Labels)
	}
	if len(d.Process.OnlyA) != 1 || d.Process.OnlyA[0].Comm != "make" || len(d.Process.OnlyB) != 1 || d.Process.OnlyB[0].Comm != "pytest" {
		t.Errorf("processes: %+v", d.Process)
	}
	if d.Size.SharedBytes == 0 || d.Size.SharedBytes >= b.Size.Files {
		t.Errorf("shared bytes %d of %d", d.Size.SharedBytes, b.Size.Files)
	}
}

func TestExportImport(t *testing.T) {
	needRoot(t)
	src := Store{Dir: t.TempDir()}
	mem := pages(3, 0, 512)
	a := createWith(t, src, "nightly", map[string][]byte{"images/pages-1.img": mem, "plan.json": []byte(`{"x":1}`)},
		func(dir string) {
			os.WriteFile(filepath.Join(dir, "file"), []byte("contents"), 0o640)
			os.Mkdir(filepath.Join(dir, "opaque"), 0o755)
			unix.Setxattr(filepath.Join(dir, "opaque"), "trusted.overlay.opaque", []byte("y"), 0)
			mknodWhiteout(t, filepath.Join(dir, "deleted"))
			os.Symlink("file", filepath.Join(dir, "link"))
		}, func(b *Branch) { b.Labels = map[string]string{"k": "v"} })
	os.WriteFile(filepath.Join(src.dirOf(a.ID), ArchiveFile), []byte("podman archive"), 0o600)
	file := filepath.Join(t.TempDir(), "nightly.tar.zst")
	key := testKey(t)
	if _, err := src.Export("nightly", file, key); err != nil {
		t.Fatal(err)
	}

	dst := Store{Dir: t.TempDir()}
	refused := errors.New("no such image here")
	if _, err := dst.Import(file, trusting(key, "", func(*Branch) error { return refused })); !errors.Is(err, refused) {
		t.Fatalf("a refused import: %v", err)
	}
	if infos, _ := dst.List(); len(infos) != 0 {
		t.Fatalf("a refused import left %v", infos)
	}
	b, err := dst.Import(file, trusting(key, "copy", func(in *Branch) error {
		if in.Name != "nightly" {
			t.Errorf("check saw %q", in.Name)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if b.Name != "copy" || b.Labels["k"] != "v" || b.ID == "" || len(b.Files) != 1 {
		t.Fatalf("imported: %+v", b)
	}
	out := readBack(t, dst, "copy")
	if got, _ := os.ReadFile(filepath.Join(out, "images/pages-1.img")); !bytes.Equal(got, mem) {
		t.Fatal("imported memory differs")
	}
	tree := dst.Path(b, RootfsTree)
	if got, _ := os.ReadFile(filepath.Join(tree, "file")); string(got) != "contents" {
		t.Errorf("tree file: %q", got)
	}
	if !rootfs.IsOpaqueDir(filepath.Join(tree, "opaque")) {
		t.Error("the opaque xattr was lost")
	}
	if st, err := os.Lstat(filepath.Join(tree, "deleted")); err != nil || !isWhiteout(st) {
		t.Errorf("the whiteout was lost: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst.dirOf(b.ID), ArchiveFile)); string(got) != "podman archive" {
		t.Errorf("checkpoint archive: %q", got)
	}
	if b.Imported == nil || !b.Imported.Trusted || b.Imported.Key != key.Public().String() {
		t.Errorf("import record: %+v", b.Imported)
	}
	if _, err := dst.Import(file, trusting(key, "copy", nil)); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second import as copy: %v", err)
	}
}

// A chunk altered in the archive is found on import, and nothing is kept.
func TestImportRefusesCorruptChunk(t *testing.T) {
	src := Store{Dir: t.TempDir()}
	createWith(t, src, "x", map[string][]byte{"images/pages-1.img": pages(4, 0, 64)}, func(string) {}, func(*Branch) {})
	file := filepath.Join(t.TempDir(), "x.tar.zst")
	key := testKey(t)
	if _, err := src.Export("x", file, key); err != nil {
		t.Fatal(err)
	}
	// Rewrite the archive with one chunk's data changed, still valid zstd.
	in, _ := os.Open(file)
	zr, _ := zstd.NewReader(in)
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	altered := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		data, _ := io.ReadAll(tr)
		if strings.HasPrefix(h.Name, archiveChunks) && !altered {
			raw, _ := boundedDecoder().DecodeAll(data, nil)
			raw[0] ^= 0xff
			data = zstdEncoder().EncodeAll(raw, nil)
			altered = true
		}
		h.Size = int64(len(data))
		tw.WriteHeader(h)
		tw.Write(data)
	}
	tw.Close()
	zw.Close()
	zr.Close()
	in.Close()
	os.WriteFile(file, buf.Bytes(), 0o600)

	dst := Store{Dir: t.TempDir()}
	if _, err := dst.Import(file, trusting(key, "", nil)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("import of a corrupt archive: %v", err)
	}
	if infos, _ := dst.List(); len(infos) != 0 {
		t.Fatalf("left %v", infos)
	}
	if _, err := dst.Import(filepath.Join(t.TempDir(), "none"), trusting(key, "", nil)); err == nil {
		t.Fatal("import of a missing file")
	}
	os.WriteFile(file, []byte("not zstd"), 0o600)
	if _, err := dst.Import(file, trusting(key, "", nil)); !errors.Is(err, ErrNotBranchArchive) {
		t.Fatalf("import of garbage: %v", err)
	}
}

// An unpacked export, its plan files kept whole where the caller chose,
// imports as its archive does: the chunks are found again by cutting the
// files, a changed file is refused as corrupt, an unknown signer as
// untrusted, and a refused import keeps nothing.
func TestUnpackedExportImport(t *testing.T) {
	needRoot(t)
	src := Store{Dir: t.TempDir()}
	mem := pages(5, 0, 700)
	a := createWith(t, src, "img", map[string][]byte{"images/pages-1.img": mem, "images/core-1.img": []byte("core"), "plan.json": []byte(`{}`)},
		func(dir string) { os.WriteFile(filepath.Join(dir, "file"), []byte("contents"), 0o640) }, func(*Branch) {})
	os.WriteFile(filepath.Join(src.dirOf(a.ID), ArchiveFile), []byte("podman archive"), 0o600)
	key := testKey(t)
	layer := t.TempDir()
	meta := filepath.Join(layer, "meta")
	os.Mkdir(meta, 0o700)
	if _, err := src.ExportUnpacked("img", meta, key); err != nil {
		t.Fatal(err)
	}
	// The plan files go elsewhere, as a checkpoint image keeps them.
	r, err := src.Open("img")
	if err != nil {
		t.Fatal(err)
	}
	planDir := filepath.Join(layer, "plan")
	if err := r.WritePlan(planDir); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if got, _ := os.ReadDir(meta); len(got) != 5 {
		t.Errorf("the unpacked export holds %d entries (chunks left out): %v", len(got), got)
	}
	planFile := func(p string) string { return filepath.Join(planDir, p) }

	dst := Store{Dir: t.TempDir()}
	if _, err := dst.ImportUnpacked(meta, planFile, "layer", trusting(testKey(t), "", nil)); !errors.Is(err, ErrUntrusted) {
		t.Errorf("an import trusting another key: %v", err)
	}
	b, err := dst.ImportUnpacked(meta, planFile, "layer", trusting(key, "back", nil))
	if err != nil {
		t.Fatal(err)
	}
	out := readBack(t, dst, "back")
	if got, _ := os.ReadFile(filepath.Join(out, "images/pages-1.img")); !bytes.Equal(got, mem) {
		t.Error("memory differs after the round trip")
	}
	if got, _ := os.ReadFile(filepath.Join(dst.Path(b, RootfsTree), "file")); string(got) != "contents" {
		t.Errorf("tree file: %q", got)
	}
	if b.Imported == nil || !b.Imported.Trusted {
		t.Errorf("import record: %+v", b.Imported)
	}

	// One byte of memory changed in the image.
	pagesFile := planFile("images/pages-1.img")
	data, _ := os.ReadFile(pagesFile)
	data[len(data)/2] ^= 1
	os.WriteFile(pagesFile, data, 0o600)
	other := Store{Dir: t.TempDir()}
	if _, err := other.ImportUnpacked(meta, planFile, "layer", trusting(key, "bad", nil)); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalid) {
		t.Errorf("an import of changed memory: %v", err)
	}
	if infos, _ := other.List(); len(infos) != 0 {
		t.Errorf("a refused import left %v", infos)
	}
	// Chunks it stored before the changed one wait for collection, as an
	// archive's do.
	if _, err := other.Collect(); err != nil {
		t.Fatal(err)
	}
	if chunks, _ := filepath.Glob(filepath.Join(other.Dir, "chunks", "*", "*")); len(chunks) != 0 {
		t.Errorf("a refused import left %d chunks after collection", len(chunks))
	}
}
