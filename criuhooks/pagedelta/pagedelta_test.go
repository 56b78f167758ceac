package pagedelta

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tclone/tclone/criuhooks/internal/pagemapimg"
)

// page is a page whose bytes say which page it is and in which version.
func page(vaddr uint64, version int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%#x v%d;", vaddr, version)), pageSize)[:pageSize]
}

// dump writes a pagemap and its pages image: entries' pages take their
// bytes from version(vaddr).
func dump(t *testing.T, dir, name string, id uint32, entries []pagemapimg.Entry, version func(uint64) int) {
	t.Helper()
	var data []byte
	for _, e := range entries {
		if e.Flags&pagemapimg.Present == 0 {
			continue
		}
		for p := uint64(0); p < e.Pages; p++ {
			data = append(data, page(e.Vaddr+p*pageSize, version(e.Vaddr+p*pageSize))...)
		}
	}
	if err := pagemapimg.Write(filepath.Join(dir, name), &pagemapimg.Image{PagesID: id, Entries: entries}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pagesPath(dir, id), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func present(vaddr, pages uint64) pagemapimg.Entry {
	return pagemapimg.Entry{Vaddr: vaddr, Pages: pages, Flags: pagemapimg.Present}
}

func TestDeltaKeepsOnlyChangedPagesAndAssemblesBack(t *testing.T) {
	parent, dir := t.TempDir(), t.TempDir()
	// The parent: task 7 with 8 pages at 0x10000 and 2 at 0x40000; task 9,
	// which has exited since; a shared-memory area.
	dump(t, parent, "pagemap-7.img", 1, []pagemapimg.Entry{present(0x10000, 8), present(0x40000, 2)}, func(uint64) int { return 1 })
	dump(t, parent, "pagemap-9.img", 2, []pagemapimg.Entry{present(0x10000, 1)}, func(uint64) int { return 1 })
	dump(t, parent, "pagemap-shmem-5.img", 3, []pagemapimg.Entry{present(0, 4)}, func(uint64) int { return 1 })
	// Now: task 7 rewrote pages 2 and 3 of its first area, unmapped its
	// second and mapped a new one; task 8 is new; the shared memory is
	// unchanged. A lazy entry (present too) keeps its flags.
	changed := func(v uint64) int {
		if v == 0x12000 || v == 0x13000 {
			return 2
		}
		return 1
	}
	e7 := []pagemapimg.Entry{{Vaddr: 0x10000, Pages: 8, Flags: pagemapimg.Lazy | pagemapimg.Present}, present(0x50000, 1), {Vaddr: 0x60000, Pages: 2, Flags: pagemapimg.Lazy | pagemapimg.Present}}
	dump(t, dir, "pagemap-7.img", 1, e7, changed)
	dump(t, dir, "pagemap-8.img", 2, []pagemapimg.Entry{present(0x10000, 3)}, func(uint64) int { return 1 })
	dump(t, dir, "pagemap-shmem-5.img", 3, []pagemapimg.Entry{present(0, 4)}, func(uint64) int { return 1 })
	originals := map[string][]byte{}
	for _, id := range []uint32{1, 2, 3} {
		data, err := os.ReadFile(pagesPath(dir, id))
		if err != nil {
			t.Fatal(err)
		}
		originals[pagesName(id)] = data
	}

	ownMaps := map[string][]byte{}
	for _, name := range []string{"pagemap-7.img", "pagemap-8.img", "pagemap-shmem-5.img"} {
		ownMaps[name], _ = os.ReadFile(filepath.Join(dir, name))
	}
	st, err := Delta(dir, parent)
	if err != nil {
		t.Fatal(err)
	}
	// Task 7: 6 of its first area's pages are the parent's; the rest
	// (2 rewritten, 1 + 2 new) are its own. Task 8 has no parent pagemap;
	// shared memory is never compared.
	if st.Pages != 8+1+2+3+4 || st.InParent != 6 || st.Pagemaps != 3 {
		t.Fatalf("stats %+v", st)
	}
	im, err := pagemapimg.Read(filepath.Join(dir, "pagemap-7.img"))
	if err != nil {
		t.Fatal(err)
	}
	// A lazy page of the parent's is PE_PARENT alone, as CRIU marks it.
	want := []pagemapimg.Entry{
		{Vaddr: 0x10000, Pages: 2, Flags: pagemapimg.InParent},
		{Vaddr: 0x12000, Pages: 2, Flags: pagemapimg.Lazy | pagemapimg.Present},
		{Vaddr: 0x14000, Pages: 4, Flags: pagemapimg.InParent},
		present(0x50000, 1),
		{Vaddr: 0x60000, Pages: 2, Flags: pagemapimg.Lazy | pagemapimg.Present},
	}
	if !reflect.DeepEqual(im.Entries, want) {
		t.Fatalf("task 7's delta pagemap:\n%+v\nwant\n%+v", im.Entries, want)
	}
	if im.PagesID <= deltaIDBase {
		t.Fatalf("pages id %d is not the delta's own", im.PagesID)
	}
	if fi, err := os.Stat(pagesPath(dir, im.PagesID)); err != nil || fi.Size() != 5*pageSize {
		t.Fatalf("task 7's delta pages image: %v, %v", fi, err)
	}
	// The old pages images are gone: in a layer over the parent's, each
	// would hide the parent's of the same name.
	for _, id := range []uint32{1, 2, 3} {
		if _, err := os.Stat(pagesPath(dir, id)); err == nil {
			t.Fatalf("%s is still in the delta", pagesName(id))
		}
	}
	for _, name := range []string{"pagemap-7.img", "pagemap-9.img", "pagemap-shmem-5.img"} {
		a, _ := os.ReadFile(filepath.Join(parent, name))
		b, err := os.ReadFile(filepath.Join(dir, ParentDir, name))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("parent/%s is no copy of the parent's: %v", name, err)
		}
	}
	for _, id := range []uint32{1, 2, 3} {
		target, err := os.Readlink(filepath.Join(dir, ParentDir, pagesName(id)))
		if err != nil || target != "../"+pagesName(id) || !CheckParentLink("checkpoint", "checkpoint/parent/"+pagesName(id), target) {
			t.Fatalf("parent/%s: %q, %v", pagesName(id), target, err)
		}
	}

	// The union of the two layers: the parent's pages images beside the
	// delta's. Each pagemap's full pages image comes back byte for byte.
	for _, id := range []uint32{1, 2, 3} {
		data, _ := os.ReadFile(pagesPath(parent, id))
		if err := os.WriteFile(pagesPath(dir, id), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kept := t.TempDir()
	for name, data := range ownMaps {
		os.WriteFile(filepath.Join(kept, name), data, 0o600)
	}
	if err := AssembleAll(dir, kept); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{1, 2, 3} {
		got, _ := os.ReadFile(pagesPath(kept, id))
		if !bytes.Equal(got, originals[pagesName(id)]) {
			t.Fatalf("%s assembled to %d bytes that differ from the dump's %d", pagesName(id), len(got), len(originals[pagesName(id)]))
		}
	}
}

// A drained capture keeps CRIU's first pages images, which no pagemap
// names: under a name of the parent's, one would hide the parent's.
func TestDeltaRefusesAPagesImageThatWouldHideTheParents(t *testing.T) {
	parent, dir := t.TempDir(), t.TempDir()
	dump(t, parent, "pagemap-7.img", 1, []pagemapimg.Entry{present(0x10000, 2)}, func(uint64) int { return 1 })
	dump(t, dir, "pagemap-7.img", 1<<30|7, []pagemapimg.Entry{present(0x10000, 2)}, func(uint64) int { return 1 })
	os.WriteFile(pagesPath(dir, 1), page(0x10000, 0), 0o600)
	if left, err := Unreferenced(dir); err != nil || len(left) != 1 || left[0] != pagesName(1) {
		t.Fatalf("Unreferenced: %v, %v", left, err)
	}
	if _, err := Delta(dir, parent); err == nil || !strings.Contains(err.Error(), "under a name of its parent's") {
		t.Fatalf("Delta with a stale pages-1.img: %v", err)
	}
	os.RemoveAll(filepath.Join(dir, ParentDir))
	dir2 := t.TempDir()
	dump(t, dir2, "pagemap-7.img", 1<<30|7, []pagemapimg.Entry{present(0x10000, 2)}, func(uint64) int { return 1 })
	if st, err := Delta(dir2, parent); err != nil || st.InParent != 2 {
		t.Fatalf("Delta without it: %+v, %v", st, err)
	}
}

// An untrusted delta cannot make the assembly write more than its images
// hold: a parent pages image serves one pagemap at most.
func TestAssembleAllRefusesAParentServingTwice(t *testing.T) {
	dir, kept := t.TempDir(), t.TempDir()
	pdir := filepath.Join(dir, ParentDir)
	os.Mkdir(pdir, 0o700)
	dump(t, pdir, "pagemap-7.img", 1, []pagemapimg.Entry{present(0x10000, 4)}, func(uint64) int { return 1 })
	dump(t, pdir, "pagemap-8.img", 1, []pagemapimg.Entry{present(0x10000, 4)}, func(uint64) int { return 1 })
	for i, name := range []string{"pagemap-7.img", "pagemap-8.img"} {
		im := &pagemapimg.Image{PagesID: uint32(deltaIDBase + 1 + i), Entries: []pagemapimg.Entry{{Vaddr: 0x10000, Pages: 4, Flags: pagemapimg.InParent}}}
		if err := pagemapimg.Write(filepath.Join(dir, name), im); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(pagesPath(dir, im.PagesID), nil, 0o600)
		im.PagesID = uint32(10 + i)
		if err := pagemapimg.Write(filepath.Join(kept, name), im); err != nil {
			t.Fatal(err)
		}
	}
	if err := AssembleAll(dir, kept); err == nil || !strings.Contains(err.Error(), "serves another pagemap too") {
		t.Fatalf("two pagemaps over one parent pages image: %v", err)
	}
}

func TestDeltaRefusesWhatIsNoFullDump(t *testing.T) {
	parent, dir := t.TempDir(), t.TempDir()
	dump(t, dir, "pagemap-7.img", 1, []pagemapimg.Entry{present(0x10000, 1)}, func(uint64) int { return 1 })
	dump(t, parent, "pagemap-7.img", 1, []pagemapimg.Entry{{Vaddr: 0x10000, Pages: 1, Flags: pagemapimg.InParent}}, func(uint64) int { return 1 })
	if _, err := Delta(dir, parent); err == nil || !strings.Contains(err.Error(), "delta, not a full dump") {
		t.Fatalf("a delta as the parent: %v", err)
	}
	parent = t.TempDir()
	dump(t, parent, "pagemap-7.img", 1, []pagemapimg.Entry{present(0x10000, 1)}, func(uint64) int { return 1 })
	if err := os.WriteFile(pagesPath(parent, 1), make([]byte, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Delta(dir, parent); err == nil || !strings.Contains(err.Error(), "holds 3 bytes") {
		t.Fatalf("a parent pages image of the wrong size: %v", err)
	}
	if !CheckParentLink("checkpoint", "checkpoint/parent/pages-1.img", "../pages-1.img") ||
		CheckParentLink("checkpoint", "checkpoint/parent/pages-1.img", "/etc/shadow") ||
		CheckParentLink("checkpoint", "checkpoint/parent/pages-1.img", "../pages-2.img") ||
		CheckParentLink("checkpoint", "checkpoint/pages-1.img", "../pages-1.img") ||
		CheckParentLink("checkpoint", "checkpoint/parent/core-1.img", "../core-1.img") {
		t.Fatal("CheckParentLink lets through a link Delta does not write")
	}
}
