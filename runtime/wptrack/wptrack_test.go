package wptrack

import (
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// area maps n private pages of this process and writes each.
func area(t *testing.T, n int) ([]byte, uint64) {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	if err := unix.Madvise(b, unix.MADV_NOHUGEPAGE); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		b[i*pageSize] = 1
	}
	return b, uint64(uintptr(unsafe.Pointer(&b[0])))
}

func tracker(t *testing.T) *Tracker {
	t.Helper()
	uffd, err := Userfaultfd()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(os.Getpid(), uffd)
	if err != nil {
		uffd.Close()
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func pagesOf(base uint64, rs []Range) []int {
	var out []int
	for _, r := range rs {
		for a := r.Start; a < r.End; a += pageSize {
			out = append(out, int((a-base)/pageSize))
		}
	}
	return out
}

func scan(t *testing.T, tr *Tracker, base uint64, n int) []int {
	t.Helper()
	rs, err := tr.Scan(base, base+uint64(n*pageSize))
	if err != nil {
		t.Fatal(err)
	}
	return pagesOf(base, rs)
}

// The first scan of an area reports every page it holds (nothing is known
// of them); later ones, exactly the pages written since the scan before,
// however they were written, and pages discarded since.
func TestScanReportsWhatWasWritten(t *testing.T) {
	tr := tracker(t)
	const n = 64
	b, base := area(t, n)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	if got := scan(t, tr, base, n); !slices.Equal(got, all) {
		t.Fatalf("first scan: pages %v, want all %d", got, n)
	}
	if got := scan(t, tr, base, n); len(got) != 0 {
		t.Fatalf("nothing written: pages %v reported", got)
	}
	b[3*pageSize] = 2
	b[4*pageSize+100] = 2
	b[40*pageSize] = 2
	if got := scan(t, tr, base, n); !slices.Equal(got, []int{3, 4, 40}) {
		t.Fatalf("three pages written: pages %v reported", got)
	}
	// Written by the kernel for the process: a read() into the page.
	p := make([]int, 2)
	if err := unix.Pipe(p); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Read(p[0], b[7*pageSize:7*pageSize+1]); err != nil {
		t.Fatal(err)
	}
	// Discarded: a hole now, which no dump lists (a restore gives it
	// zeros), and which is reported once it is there again.
	if err := unix.Madvise(b[20*pageSize:22*pageSize], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if got := scan(t, tr, base, n); !slices.Equal(got, []int{7}) {
		t.Fatalf("a read() into page 7 and pages 20-21 discarded: pages %v reported, want 7", got)
	}
	if b[20*pageSize] != 0 { // a read: the zero page
		t.Fatal("a discarded page reads other than zero")
	}
	b[21*pageSize] = 5
	if got := scan(t, tr, base, n); !slices.Equal(got, []int{20, 21}) {
		t.Fatalf("discarded pages read and written again: pages %v reported, want 20 and 21", got)
	}
}

// An area registered with the process's own userfaultfd cannot be
// tracked, and the tracker says so rather than reporting nothing written.
func TestScanRefusesAnAreaOfAnotherUserfaultfd(t *testing.T) {
	tr := tracker(t)
	_, base := area(t, 8)
	own, err := Userfaultfd()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	api := uffdioAPIArg{API: uffdAPI}
	if err := ioctl(own, uffdioAPI, unsafe.Pointer(&api)); err != nil {
		t.Fatal(err)
	}
	reg := uffdioRegisterArg{Start: base, Len: 8 * pageSize, Mode: uffdioRegisterModeWP}
	if err := ioctl(own, uffdioRegister, unsafe.Pointer(&reg)); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Scan(base, base+8*pageSize); !errors.Is(err, ErrForeign) {
		t.Fatalf("scan of an area of another userfaultfd: %v, want ErrForeign", err)
	}
}

// Holes in a tracked area stay holes: a scan protects only pages that are
// there. A protected hole would be a marker, which /proc/PID/pagemap (and
// CRIU reading it) shows as a page swapped out.
func TestScanLeavesHoles(t *testing.T) {
	tr := tracker(t)
	const n = 64
	b, base := area(t, n)
	if err := unix.Madvise(b[32*pageSize:], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if got := scan(t, tr, base, n); len(got) != 32 || got[31] != 31 {
		t.Fatalf("first scan of a half-touched area: pages %v, want the first 32", got)
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	buf := make([]byte, 8*n)
	if _, err := pm.ReadAt(buf, int64(base/pageSize*8)); err != nil {
		t.Fatal(err)
	}
	for i := 32; i < n; i++ {
		if e := binary.LittleEndian.Uint64(buf[8*i:]); e>>62 != 0 {
			t.Fatalf("page %d, a hole, reads %#x in pagemap after a scan (present or swapped)", i, e)
		}
	}
	b[40*pageSize] = 3
	if got := scan(t, tr, base, n); !slices.Equal(got, []int{40}) {
		t.Fatalf("a hole written: pages %v reported, want 40", got)
	}
}
