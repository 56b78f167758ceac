package branch

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/rootfs"
)

// pages returns n pages of pseudo-random data from seed, each page's bytes
// depending only on seed and its index.
func pages(seed int64, from, n int) []byte {
	out := make([]byte, 0, n*pageSize)
	for i := from; i < from+n; i++ {
		p := make([]byte, pageSize)
		rand.New(rand.NewSource(seed*1_000_003 + int64(i))).Read(p)
		out = append(out, p...)
	}
	return out
}

func chunkSet(data []byte) map[string]bool {
	set := map[string]bool{}
	off := 0
	for _, l := range cuts(data) {
		set[string(data[off:off+l])] = true
		off += l
	}
	return set
}

// Pages inserted at the front move the cuts with the data: nearly every
// chunk after them is the same.
func TestCutsFollowContent(t *testing.T) {
	a := pages(1, 0, 4096)
	b := append(pages(2, 0, 3), a...)
	ca, cb := chunkSet(a), chunkSet(b)
	shared := 0
	for c := range ca {
		if cb[c] {
			shared++
		}
	}
	if shared < len(ca)-2 {
		t.Fatalf("%d of %d chunks shared after inserting 3 pages", shared, len(ca))
	}
	total := 0
	for _, l := range cuts(a) {
		if l%pageSize != 0 && total+l != len(a) {
			t.Fatalf("a cut inside a page: chunk of %d bytes", l)
		}
		if l > maxPages*pageSize {
			t.Fatalf("chunk of %d bytes, over the maximum", l)
		}
		total += l
	}
	if total != len(a) {
		t.Fatalf("chunks cover %d of %d bytes", total, len(a))
	}
	if n := len(ca); n < 4096/maxPages || n > 4096/minPages {
		t.Fatalf("%d chunks for 4096 pages", n)
	}
	// A tail shorter than a page is a chunk of its own size.
	odd := append(pages(3, 0, 5), 1, 2, 3)
	if got := cuts(odd); len(got) != 1 || got[0] != len(odd) {
		t.Fatalf("cuts of %d bytes: %v", len(odd), got)
	}
}

func writePlan(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func create(t *testing.T, s Store, name string, files map[string][]byte) *Branch {
	t.Helper()
	return createWith(t, s, name, files, func(tree string) {
		os.WriteFile(filepath.Join(tree, "f"), []byte("tree file"), 0o644)
	}, func(b *Branch) { b.Labels = map[string]string{"k": "v"} })
}

// createWith makes a branch of the plan files and a root filesystem tree
// that fillTree writes; fill sets the manifest's other fields.
func createWith(t *testing.T, s Store, name string, files map[string][]byte, fillTree func(dir string), fill func(*Branch)) *Branch {
	t.Helper()
	plan := t.TempDir()
	writePlan(t, plan, files)
	w, err := s.Begin(name, Source{ID: testSourceID, Name: "ws"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddPlan(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	os.Mkdir(tree, 0o755)
	fillTree(tree)
	if err := w.AddTree(context.Background(), tree, RootfsTree, true); err != nil {
		t.Fatal(err)
	}
	b, err := w.Commit(func(b *Branch) {
		// As a capture with a root filesystem records it.
		b.Plan.Rootfs = &rootfs.Snapshot{Kind: rootfs.KindOverlay}
		fill(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testSourceID is a container ID, as Podman makes them.
var testSourceID = strings.Repeat("5a", 32)

// readBack writes the plan of branch ref into a new directory, and returns
// it; any error fails the test.
func readBack(t *testing.T, s Store, ref string) string {
	t.Helper()
	r, err := s.Open(ref)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := t.TempDir()
	if err := r.WritePlan(out); err != nil {
		t.Fatalf("reading branch %s back: %v", ref, err)
	}
	return out
}

func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	return treeSize(dir)
}

func TestRoundTripDedupAndRemove(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	mem := pages(7, 0, 2048) // 8 MiB
	files := map[string][]byte{"images/pages-1.img": mem, "images/core-1.img": []byte("core"), "plan.json": []byte("{}"),
		"uses": []byte("not kept"), "lock": nil}
	a := create(t, s, "first", files)
	if len(a.Files) != 2 { // plan.json is the manifest's; uses and lock the live plan's
		t.Fatalf("files kept: %+v", a.Files)
	}
	oneBranch := diskBytes(t, s.Dir)

	// A second branch that changed 64 pages in the middle adds about
	// those pages' chunks, not the whole image.
	changed := bytes.Clone(mem)
	copy(changed[1000*pageSize:], pages(8, 0, 64))
	files["images/pages-1.img"] = changed
	b := create(t, s, "second", files)
	if b.Size.ChunksAdded > int64(len(mem))/4 {
		t.Fatalf("the second branch added %d bytes for a 256 KiB change of an 8 MiB image", b.Size.ChunksAdded)
	}
	if grew := diskBytes(t, s.Dir) - oneBranch; grew > int64(len(mem))/4 {
		t.Fatalf("the store grew by %d bytes for the second branch", grew)
	}

	out := readBack(t, s, "first")
	if got, _ := os.ReadFile(filepath.Join(out, "images/pages-1.img")); !bytes.Equal(got, mem) {
		t.Fatal("the plan read back differs")
	}
	if _, err := os.Stat(filepath.Join(out, "uses")); err == nil {
		t.Fatal("the live plan's use count was kept")
	}
	if got, _ := os.ReadFile(filepath.Join(s.Path(a, RootfsTree), "f")); string(got) != "tree file" {
		t.Fatalf("tree: %q", got)
	}

	if _, err := s.Begin("first", Source{}); err == nil || !strings.Contains(err.Error(), "branch rm first") {
		t.Fatalf("a second branch named first: %v", err)
	}
	rep, err := s.Remove("first")
	if err != nil || rep.Chunks == 0 {
		t.Fatalf("remove: %+v %v", rep, err)
	}
	// The second branch still reads back whole.
	readBack(t, s, b.ID)
	if _, err := s.Get("first"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a removed branch: %v", err)
	}
}

func TestCorruptChunkIsNamed(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	b := create(t, s, "c", map[string][]byte{"images/pages-1.img": pages(1, 0, 64)})
	victim := b.Files[0].Chunks[0].Hash
	path := s.chunks().path(victim)
	packed, _ := os.ReadFile(path)
	// Same size, other contents: a bit flipped on disk.
	data, _ := boundedDecoder().DecodeAll(packed, nil)
	data[100] ^= 1
	os.WriteFile(path, zstdEncoder().EncodeAll(data, nil), 0o600)
	r, err := s.Open("c")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	err = r.WritePlan(t.TempDir())
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), victim) || !strings.Contains(err.Error(), "images/pages-1.img") {
		t.Fatalf("corrupt chunk: %v", err)
	}
	os.Remove(path)
	if err := r.WritePlan(t.TempDir()); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing chunk: %v", err)
	}
}

// A writer that dies leaves no visible branch; Collect removes its data
// and its chunks, and leaves a live writer's alone.
func TestDeadWriterIsCollected(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	keep := create(t, s, "keep", map[string][]byte{"images/pages-1.img": pages(1, 0, 64)})
	w, err := s.Begin("dying", Source{})
	if err != nil {
		t.Fatal(err)
	}
	plan := t.TempDir()
	writePlan(t, plan, map[string][]byte{"images/pages-1.img": pages(2, 0, 64)})
	if err := w.AddPlan(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	infos, _ := s.List()
	if len(infos) != 2 || infos[1].State != StateWriting {
		t.Fatalf("while writing: %+v", infos)
	}
	rep, _ := s.Collect()
	if len(rep.Partial) != 0 || !rep.ChunksBusy {
		t.Fatalf("collect while a writer lives: %+v", rep)
	}
	// Its death lets its lock go, as kill -9 would.
	w.release()
	infos, _ = s.List()
	if len(infos) != 1 || infos[0].ID != keep.ID {
		t.Fatalf("after the writer died: %+v", infos)
	}
	rep, err = s.Collect()
	if err != nil || len(rep.Partial) != 1 || rep.Chunks == 0 {
		t.Fatalf("collect after the writer died: %+v %v", rep, err)
	}
	readBack(t, s, "keep")
}

func TestNames(t *testing.T) {
	for _, bad := range []string{"", "-x", "a b", "0123456789abcdef", strings.Repeat("a", 129)} {
		if CheckName(bad) == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	for _, good := range []string{"before-migration", "nightly.2026-12-01", "a_b"} {
		if err := CheckName(good); err != nil {
			t.Errorf("name %q: %v", good, err)
		}
	}
}

// A writer that fails after its caller went leaves the branch listed as
// failed, with why; a start waiting for it is told; rm and gc remove it.
func TestFailedBranch(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	w, err := s.Begin("late", Source{Name: "ws"})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- s.WaitDurable(context.Background(), "late") }()
	w.Fail(errors.New("disk full"))
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("waiting for a failed branch: %v", err)
	}
	infos, _ := s.List()
	if len(infos) != 1 || infos[0].State != StateFailed || infos[0].Error != "disk full" {
		t.Fatalf("ls: %+v", infos)
	}
	if _, err := s.Begin("late", Source{}); err == nil || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("the name of a failed branch: %v", err)
	}
	if rep, err := s.Remove("late"); err != nil || len(rep.Branches) != 1 {
		t.Fatalf("rm of a failed branch: %+v %v", rep, err)
	}
	if infos, _ := s.List(); len(infos) != 0 {
		t.Fatalf("after rm: %+v", infos)
	}
	// A durable one is waited for until it is: while it is written, a wait
	// ends only with its context.
	w, _ = s.Begin("soon", Source{})
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitDurable(expired, "soon"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait for a branch being written returned %v, want its context's end", err)
	}
	go func() { waited <- s.WaitDurable(context.Background(), "soon") }()
	if _, err := w.Commit(func(*Branch) {}); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("waiting for a branch made durable: %v", err)
	}
	if err := s.WaitDurable(context.Background(), "never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("waiting for no branch: %v", err)
	}
}
