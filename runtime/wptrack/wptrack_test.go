package wptrack

import (
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
	// Discarded: the page is zero now, not what the last scan saw.
	if err := unix.Madvise(b[20*pageSize:22*pageSize], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if got := scan(t, tr, base, n); !slices.Equal(got, []int{7, 20, 21}) {
		t.Fatalf("a read() into page 7 and pages 20-21 discarded: pages %v reported", got)
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
