package pagemapimg

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"
)

func TestOldEntriesAreResolvedLikeCRIU(t *testing.T) {
	old := &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(3)}
	e, err := Resolve(old)
	if err != nil || e.Pages != 3 || e.Flags != Present {
		t.Fatalf("entry without flags = %+v, %v; want 3 present pages", e, err)
	}
	old.InParent = proto.Bool(true)
	if e, _ := Resolve(old); e.Flags&InParent == 0 || e.Flags&Present != 0 {
		t.Fatalf("in_parent entry = %+v", e)
	}
}

func TestWriteReadsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pagemap-7.img")
	want := &Image{PagesID: 1<<29 | 3, Entries: []Entry{
		{Vaddr: 0x1000, Pages: 1, Flags: Present},
		// More pages than the old 32-bit field holds: field 5 carries them.
		{Vaddr: 0x10000, Pages: 1<<32 + 5, Flags: InParent},
		{Vaddr: 0x7f0000000000, Pages: 2, Flags: Lazy | Present},
	}}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v, wrote %+v", got, want)
	}
	if err := Write(path, want); err == nil {
		t.Fatal("Write replaced an existing image")
	}
	huge := filepath.Join(filepath.Dir(path), "pagemap-8.img")
	if err := Write(huge, &Image{PagesID: 1, Entries: []Entry{{Vaddr: 0x1000, Pages: 1 << 52, Flags: Present}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(huge); err == nil {
		t.Fatal("an entry past the address space was read")
	}
	for i, entries := range [][]Entry{
		{{Vaddr: 0x3000, Pages: 1, Flags: Present}, {Vaddr: 0x1000, Pages: 1, Flags: Present}},   // out of order
		{{Vaddr: 0x1000, Pages: 4, Flags: Present}, {Vaddr: 0x3000, Pages: 1, Flags: InParent}},  // overlapping
		{{Vaddr: 0x1000, Pages: 1, Flags: InParent}, {Vaddr: 0x1000, Pages: 1, Flags: InParent}}, // the same twice
		{{Vaddr: 0x1001, Pages: 1, Flags: Present}},                                              // not page-aligned
	} {
		bad := filepath.Join(filepath.Dir(path), fmt.Sprintf("pagemap-bad-%d.img", i))
		if err := Write(bad, &Image{PagesID: 1, Entries: entries}); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(bad); err == nil {
			t.Errorf("entries %+v were read", entries)
		}
	}
	if e := want.Entries[0]; e.End() != 0x2000 {
		t.Fatalf("End of %+v = %#x", e, e.End())
	}
}
