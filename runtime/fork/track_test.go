package fork

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/criucheck"
)

// Write tracking covers private anonymous memory only: a file's private
// mapping, which the kernel would register too, leaves write-protect
// markers where its pages go, which read as unwritten pages.
func TestPrivateAreasAreAnonymous(t *testing.T) {
	anon, err := unix.Mmap(-1, 0, 4*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 4*4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	file, err := unix.Mmap(int(f.Fd()), 0, 4*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(file)
	file[0] = 1 // a copied-on-write page: anonymous, in a file's area
	areas, err := privateAreas(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	in := func(b []byte) bool {
		a := uint64(uintptr(unsafe.Pointer(&b[0])))
		for _, r := range areas {
			if r[0] <= a && a < r[1] {
				return true
			}
		}
		return false
	}
	if !in(anon) {
		t.Errorf("the anonymous area is not among %x", areas)
	}
	if in(file) {
		t.Errorf("the file's private mapping is among %x", areas)
	}
}

func TestTrackingNeedsLinux613(t *testing.T) {
	for kernel, want := range map[string]bool{"6.7.0": false, "6.12.117+deb13-cloud-amd64": false, "6.13.0": true, "6.18.44-fc-v1272": true, "7.3.4+deb13-cloud-amd64": true} {
		if got := trackingAvailable(&criucheck.Result{Kernel: kernel}); got != want {
			t.Errorf("kernel %s: tracking %v, want %v", kernel, got, want)
		}
	}
}
