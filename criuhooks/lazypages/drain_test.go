package lazypages

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
)

// twinDump writes a one-task dump of pid 7 as a lazy dump leaves it: an
// eager page with its data in pages-3.img, and lazy pages without theirs;
// and a "twin" (a sparse file read at the pages' addresses) holding the
// lazy pages' data, each page filled with a byte of its own.
func twinDump(t *testing.T) (dir string, twin *os.File) {
	t.Helper()
	dir = t.TempDir()
	imagetest.Write(t, filepath.Join(dir, "pstree.img"), "PSTREE", &pstree.PstreeEntry{Pid: proto.Uint32(7), Ppid: proto.Uint32(0), Pgid: proto.Uint32(7), Sid: proto.Uint32(7)})
	imagetest.Write(t, filepath.Join(dir, "pagemap-7.img"), "PAGEMAP",
		&pagemap.PagemapHead{PagesId: proto.Uint32(3)},
		criu4Entry(0x1000, 1, pagePresent),
		criu4Entry(0x10000, 3, pageLazy),
		criu4Entry(0x30000, 1, pageLazy),
	)
	imagetest.Write(t, filepath.Join(dir, "mm-7.img"), "MM", mmEntry(
		vmaEntry(0x1000, 0x2000), vmaEntry(0x10000, 0x20000), vmaEntry(0x30000, 0x40000)))
	if err := os.WriteFile(filepath.Join(dir, "pages-3.img"), bytes.Repeat([]byte{0xee}, pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	twin, err := os.Create(filepath.Join(t.TempDir(), "twin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { twin.Close() })
	for i, addr := range []int64{0x10000, 0x11000, 0x12000, 0x30000} {
		if _, err := twin.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, pageSize), addr); err != nil {
			t.Fatal(err)
		}
	}
	return dir, twin
}

// Draining writes the task's pages into an image of its own, in pagemap
// order (the eager page from the dump's image, the lazy ones from the
// twin), rewrites the pagemap to say they are there, publishes both into
// the plan's directory, marks the plan drained, and releases the twin once
// nothing reads it: at once when no filler holds it, else when the last
// one lets go.
func TestDrainWritesPlainImagesAndReleasesTheTwin(t *testing.T) {
	for _, holding := range []bool{false, true} {
		dir, twin := twinDump(t)
		plan := t.TempDir()
		for _, name := range []string{"pstree.img", "mm-7.img", "pagemap-7.img", "pages-3.img"} {
			if err := os.Link(filepath.Join(dir, name), filepath.Join(plan, name)); err != nil {
				t.Fatal(err)
			}
		}
		im, err := OpenImages(dir)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var released []int32
		cfg := &Drain{PlanImages: plan, Release: func(pid int32) { mu.Lock(); released = append(released, pid); mu.Unlock() }}
		im.snapshots = map[int32]*os.File{7: twin}
		im.drainRelease = cfg.Release

		var held heldSource
		if holding {
			_, src, err := im.task(7)
			if err != nil {
				t.Fatal(err)
			}
			var ok bool
			if held, ok = src.(heldSource); !ok {
				t.Fatalf("a twin task's source is a %T, not one its fillers hold", src)
			}
			held.hold()
		}
		if err := im.drain(cfg, make(chan struct{})); err != nil {
			t.Fatal(err)
		}
		st := im.Drained()
		if !st.Done || st.Drained != 1 || st.Bytes != 4*pageSize {
			t.Fatalf("drain state %+v, want 1 task, 4 pages copied, done", st)
		}
		mu.Lock()
		n := len(released)
		mu.Unlock()
		if holding && n != 0 {
			t.Fatal("the twin was released while a filler still read it")
		}
		if holding {
			held.drop()
		}
		mu.Lock()
		if len(released) != 1 || released[0] != 7 {
			t.Fatalf("released %v, want task 7 once", released)
		}
		mu.Unlock()

		// The plan's own directory now holds a plain dump: any reader,
		// this daemon or another, finds every page in an image.
		for _, d := range []string{dir, plan} {
			im2, err := OpenImages(d)
			if err != nil {
				t.Fatal(err)
			}
			task, src, err := im2.task(7)
			if err != nil {
				t.Fatalf("%s: %v", d, err)
			}
			var got []byte
			for _, s := range task.lazy {
				var buf []byte
				b, err := src.at(&buf, s.len(), s.src)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, b...)
			}
			var want []byte
			for i := 1; i <= 4; i++ {
				want = append(want, bytes.Repeat([]byte{byte(i)}, pageSize)...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: the drained lazy pages differ from the twin's", d)
			}
			im2.Close()
		}
		if _, err := os.Stat(filepath.Join(plan, DrainedMarker)); err != nil {
			t.Fatalf("the plan is not marked drained: %v", err)
		}
		// A task served after the drain reads the image, not the twin.
		if _, src, err := im.task(7); err != nil {
			t.Fatal(err)
		} else if _, isTwin := src.(heldSource); isTwin {
			t.Fatal("after the drain the daemon still reads the twin")
		}
		im.Close()
	}
}

// A twin that cannot be read (it died) fails the drain, and says which task.
func TestDrainOfADeadTwinFails(t *testing.T) {
	dir, twin := twinDump(t)
	im, err := OpenImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	twin.Truncate(0x10000) // nothing at the lazy pages' addresses
	cfg := &Drain{Release: func(int32) {}}
	im.snapshots = map[int32]*os.File{7: twin}
	im.drainRelease = cfg.Release
	err = im.drain(cfg, make(chan struct{}))
	if err == nil {
		t.Fatal("a drain from a twin with no memory succeeded")
	}
	if _, werr := im.WaitDrained(); werr == nil {
		t.Fatal("WaitDrained of a failed drain reports no error")
	}
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("pages-%d.img", drainedPagesID(7)))); err == nil {
		t.Fatal("a failed drain left its pages image in place")
	}
}
