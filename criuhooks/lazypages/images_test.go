package lazypages

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
	"github.com/tclone/tclone/criuhooks/internal/pagemapimg"
)

// criu4Entry is a pagemap entry as CRIU 4.x writes it: the page count in
// field 5, the old 32-bit field left 0.
func criu4Entry(vaddr, pages uint64, flags uint32) *pagemap.PagemapEntry {
	return pagemapimg.Message(pagemapimg.Entry{Vaddr: vaddr, Pages: pages, Flags: flags})
}

func vmaEntry(start, end uint64) *vma.VmaEntry {
	return &vma.VmaEntry{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0),
		Shmid: proto.Uint64(0), Prot: proto.Uint32(3), Flags: proto.Uint32(0x22), Status: proto.Uint32(0x201),
		Fd: proto.Int64(-1)}
}

func mmEntry(vmas ...*vma.VmaEntry) *mm.MmEntry {
	z := proto.Uint64(0)
	return &mm.MmEntry{MmStartCode: z, MmEndCode: z, MmStartData: z, MmEndData: z, MmStartStack: z,
		MmStartBrk: z, MmBrk: z, MmArgStart: z, MmArgEnd: z, MmEnvStart: z, MmEnvEnd: z,
		ExeFileId: proto.Uint32(0), Vmas: vmas}
}

// fakeDump writes a one-task dump of pid 7 whose memory holds: an eager
// page (the stack, not lazy), a lazy run that crosses a VMA boundary, a hole
// from a parent dump, and a lazy page; pages-3.img holds the present pages
// in pagemap order.
func fakeDump(t *testing.T, pages int) string {
	t.Helper()
	dir := t.TempDir()
	imagetest.Write(t, filepath.Join(dir, "pstree.img"), "PSTREE", &pstree.PstreeEntry{Pid: proto.Uint32(7), Ppid: proto.Uint32(0), Pgid: proto.Uint32(7), Sid: proto.Uint32(7)})
	imagetest.Write(t, filepath.Join(dir, "pagemap-7.img"), "PAGEMAP",
		&pagemap.PagemapHead{PagesId: proto.Uint32(3)},
		criu4Entry(0x1000, 1, pagePresent),
		criu4Entry(0x10000, 4, pageLazy|pagePresent),
		criu4Entry(0x20000, 2, pageInParent),
		criu4Entry(0x30000, 1, pageLazy|pagePresent),
	)
	imagetest.Write(t, filepath.Join(dir, "mm-7.img"), "MM", mmEntry(
		vmaEntry(0x1000, 0x2000), vmaEntry(0x10000, 0x12000), vmaEntry(0x12000, 0x20000), vmaEntry(0x20000, 0x40000)))
	if err := os.WriteFile(filepath.Join(dir, "pages-3.img"), make([]byte, pages*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestTaskImageOffsetsSkipEagerAndParentPages(t *testing.T) {
	im, err := OpenImages(fakeDump(t, 6))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	task, data, err := im.task(7)
	if err != nil {
		t.Fatal(err)
	}
	want := []span{
		{0x10000, 0x12000, 1 * pageSize}, // after the eager page
		{0x12000, 0x14000, 3 * pageSize}, // same entry, next VMA
		{0x30000, 0x31000, 5 * pageSize}, // the parent hole takes no room
	}
	if !reflect.DeepEqual(task.lazy, want) {
		t.Fatalf("lazy spans = %#v, want %#v", task.lazy, want)
	}
	if task.bytes != 5*pageSize || len(data.(mappedPages)) != 6*pageSize {
		t.Fatalf("bytes = %d, data = %d", task.bytes, len(data.(mappedPages)))
	}
	again, _, _ := im.task(7)
	if again != task {
		t.Fatal("a second sibling's task was read again instead of shared")
	}
}

func TestTruncatedPagesImageIsRefused(t *testing.T) {
	im, err := OpenImages(fakeDump(t, 5))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if _, _, err := im.task(7); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("task on a short pages image: %v", err)
	}
}

func TestLazyDumpIsRefused(t *testing.T) {
	dir := fakeDump(t, 6)
	imagetest.Write(t, filepath.Join(dir, "pagemap-7.img"), "PAGEMAP",
		&pagemap.PagemapHead{PagesId: proto.Uint32(3)}, criu4Entry(0x10000, 4, pageLazy))
	im, _ := OpenImages(dir)
	defer im.Close()
	if _, _, err := im.task(7); err == nil || !strings.Contains(err.Error(), "--lazy-pages") {
		t.Fatalf("task of a lazy dump: %v", err)
	}
}

func TestNotADump(t *testing.T) {
	if _, err := OpenImages(t.TempDir()); err == nil || !strings.Contains(err.Error(), "pstree.img") {
		t.Fatalf("OpenImages of an empty dir: %v", err)
	}
}

func TestLazyDumpWithSnapshotsReadsAtAddresses(t *testing.T) {
	dir := fakeDump(t, 0)
	imagetest.Write(t, filepath.Join(dir, "pagemap-7.img"), "PAGEMAP",
		&pagemap.PagemapHead{PagesId: proto.Uint32(3)},
		criu4Entry(0x1000, 1, pagePresent), // the eager stack page is in the pages image
		criu4Entry(0x10000, 4, pageLazy),   // a --lazy-pages dump: not present
		criu4Entry(0x30000, 1, pageLazy),
	)
	snap, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	im, err := OpenImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	im.snapshots = map[int32]*os.File{7: snap}
	task, src, err := im.task(7)
	if err != nil {
		t.Fatal(err)
	}
	want := []span{{0x10000, 0x12000, 0x10000}, {0x12000, 0x14000, 0x12000}, {0x30000, 0x31000, 0x30000}}
	if !reflect.DeepEqual(task.lazy, want) {
		t.Fatalf("lazy spans = %#v, want %#v (data at the pages' own addresses)", task.lazy, want)
	}
	if got, ok := src.(snapshotPages); !ok || got.f != snap {
		t.Fatalf("source = %#v, want the task's snapshot", src)
	}
	im.snapshots = map[int32]*os.File{8: snap}
	im.tasks = map[int32]*taskImage{}
	if _, _, err := im.task(7); err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Fatalf("task with lazy memory and no snapshot: %v", err)
	}
	// A task with no lazy memory needs none.
	imagetest.Write(t, filepath.Join(dir, "pagemap-7.img"), "PAGEMAP",
		&pagemap.PagemapHead{PagesId: proto.Uint32(3)}, criu4Entry(0x1000, 1, pagePresent))
	im.tasks = map[int32]*taskImage{}
	if task, _, err := im.task(7); err != nil || len(task.lazy) != 0 {
		t.Fatalf("task without lazy memory or snapshot: %+v, %v", task, err)
	}
}

func TestSnapshotSourceReadsWhole(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "snap")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := []byte(strings.Repeat("0123456789abcdef", 1024))
	if _, err := f.WriteAt(data, 0x3000); err != nil {
		t.Fatal(err)
	}
	var buf []byte
	got, err := snapshotPages{f}.at(&buf, 100, 0x3000+5)
	if err != nil || string(got) != string(data[5:105]) {
		t.Fatalf("at = %q, %v", got, err)
	}
	if _, err := (snapshotPages{f}).at(&buf, 100, 0x3000+uint64(len(data))); err == nil {
		t.Fatal("a read past the end succeeded")
	}
	// A mapping is sliced, and leaves the buffer alone.
	var none []byte
	if got, _ := mappedPages(data).at(&none, 16, 32); string(got) != string(data[32:48]) || none != nil {
		t.Fatalf("mapped at = %q, buffer %d bytes", got, len(none))
	}
}
