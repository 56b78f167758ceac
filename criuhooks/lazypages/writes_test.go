package lazypages

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestTaskWritesRun(t *testing.T) {
	const p = pageSize
	w := &TaskWrites{
		Tracked: []Range{{10 * p, 20 * p}, {30 * p, 40 * p}},
		Written: []Range{{12 * p, 14 * p}, {35 * p, 36 * p}},
	}
	for _, c := range []struct {
		addr, end uint64
		base      bool
		runEnd    uint64
	}{
		{0, 50 * p, false, 10 * p},        // untracked
		{10 * p, 50 * p, true, 12 * p},    // tracked, not written
		{12 * p, 50 * p, false, 14 * p},   // written
		{14 * p, 50 * p, true, 20 * p},    // tracked again up to the area's end
		{20 * p, 50 * p, false, 30 * p},   // between areas
		{30 * p, 33 * p, true, 33 * p},    // bounded by end
		{36 * p, 100 * p, true, 40 * p},   // after the last write
		{40 * p, 100 * p, false, 100 * p}, // after every area
	} {
		base, runEnd := w.run(c.addr, c.end)
		if base != c.base || runEnd != c.runEnd {
			t.Errorf("run(%d, %d) = %v, %d; want %v, %d", c.addr/p, c.end/p, base, runEnd/p, c.base, c.runEnd/p)
		}
	}
}

// An incremental drain takes from the base exactly the pages of tracked
// areas that were not written, where the base holds them, and every other
// page from the snapshot.
func TestWriteDrainedFromBase(t *testing.T) {
	const p = pageSize
	const v = 64 * p
	dir := t.TempDir()
	page := func(c byte) []byte { return bytes.Repeat([]byte{c}, p) }
	// The snapshot: its pages at their own addresses, 'T'+i.
	snap, err := os.Create(filepath.Join(dir, "snap"))
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	for i := 0; i < 8; i++ {
		if _, err := snap.WriteAt(page(byte('0'+i)), v+int64(i)*p); err != nil {
			t.Fatal(err)
		}
	}
	// The base holds pages 0-5, 'a'+i.
	var baseData []byte
	for i := 0; i < 6; i++ {
		baseData = append(baseData, page(byte('a'+i))...)
	}
	base := &basePages{r: bytes.NewReader(baseData), entries: []baseEntry{{v, v + 6*p, 0}}}
	writes := &TaskWrites{Tracked: []Range{{v, v + 8*p}}, Written: []Range{{v + 2*p, v + 4*p}}}
	entries := []pagemapEntry{{Vaddr: v, Pages: 8, Flags: pageLazy}}
	out := filepath.Join(dir, "pages")
	copied, fromBase, err := writeDrained(out, filepath.Join(dir, "none"), entries, snapshotPages{snap}, writes, base)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := "ab23ef67"
	for i := 0; i < 8; i++ {
		if got[i*p] != want[i] || !bytes.Equal(got[i*p:(i+1)*p], page(want[i])) {
			t.Errorf("page %d holds %q, want %q", i, got[i*p], want[i])
		}
	}
	if copied != 4*p || fromBase != 4*p {
		t.Errorf("%d bytes from the snapshot and %d from the base, want 4 pages each", copied, fromBase)
	}
}
