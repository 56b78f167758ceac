package cherrypick

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const headerPath = "../vma_cherrypick/vma_cherrypick.h"

func readHeader(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(headerPath)
	if err != nil {
		t.Fatalf("read the uapi header: %v", err)
	}
	return string(b)
}

func headerDefine(t *testing.T, header, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+\(?(0x[0-9A-Fa-f]+|\d+)(ULL)?\s*(<<\s*(\d+))?\)?`).FindStringSubmatch(header)
	if m == nil {
		t.Fatalf("%s not defined in %s", name, headerPath)
	}
	v, err := strconv.ParseUint(m[1], 0, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if m[4] != "" {
		shift, _ := strconv.Atoi(m[4])
		v <<= shift
	}
	return v
}

func TestStructLayoutMatchesKernel(t *testing.T) {
	// The kernel structs are all fixed-width fields with no padding.
	if got := unsafe.Sizeof(versionArgs{}); got != 16 {
		t.Errorf("struct vcp_version: %d bytes, want 16", got)
	}
	if got := unsafe.Sizeof(cherrypickArgs{}); got != 56 {
		t.Errorf("struct vcp_cherrypick: %d bytes, want 56", got)
	}
	if got := unsafe.Offsetof(cherrypickArgs{}.Start); got != 8 {
		t.Errorf("vcp_cherrypick.start at offset %d, want 8", got)
	}
	if got := unsafe.Offsetof(cherrypickArgs{}.SwapEntries); got != 48 {
		t.Errorf("vcp_cherrypick.swap_entries at offset %d, want 48", got)
	}
}

func TestIoctlNumbers(t *testing.T) {
	// Values as the C preprocessor computes _IOR(0xE4, 0, 16) and
	// _IOWR(0xE4, 1, 56) on x86-64.
	if iocVersion != 0x8010E400 {
		t.Errorf("VCP_IOC_VERSION = %#x, want 0x8010e400", iocVersion)
	}
	if iocCherrypick != 0xC038E401 {
		t.Errorf("VCP_IOC_CHERRYPICK = %#x, want 0xc038e401", iocCherrypick)
	}
}

func TestConstantsMatchHeader(t *testing.T) {
	h := readHeader(t)
	if got := headerDefine(t, h, "VCP_IOC_MAGIC"); got != iocMagic {
		t.Errorf("VCP_IOC_MAGIC: header %#x, Go %#x", got, iocMagic)
	}
	if got := headerDefine(t, h, "VCP_ABI_VERSION"); got != ABIVersion {
		t.Errorf("VCP_ABI_VERSION: header %d, Go %d", got, ABIVersion)
	}
	for name, want := range map[string]Features{
		"VCP_FEATURE_ANON":         FeatureAnon,
		"VCP_FEATURE_FILE_PRIVATE": FeatureFilePrivate,
		"VCP_FEATURE_THP":          FeatureTHP,
	} {
		if got := headerDefine(t, h, name); Features(got) != want {
			t.Errorf("%s: header %#x, Go %#x", name, got, want)
		}
	}
}

// Every errno the header documents has a named error, and no other.
func TestErrnoMappingMatchesHeader(t *testing.T) {
	h := readHeader(t)
	documented := map[unix.Errno]string{}
	for _, m := range regexp.MustCompile(`(?m)^ \* (E[A-Z]+)\s`).FindAllStringSubmatch(h, -1) {
		errno := errnoByName(m[1])
		if errno == 0 {
			t.Errorf("header documents %s, which is not an errno", m[1])
		}
		documented[errno] = m[1]
	}
	if len(documented) == 0 {
		t.Fatal("no errno documented in the header")
	}
	for errno, name := range documented {
		if _, ok := errnoErrors[errno]; !ok {
			t.Errorf("header documents %s, Go has no error for it", name)
		}
	}
	for errno := range errnoErrors {
		if _, ok := documented[errno]; !ok {
			t.Errorf("Go maps %s, the header does not document it", unix.ErrnoName(errno))
		}
	}
}

// errnoByName inverts unix.ErrnoName, which spells EOPNOTSUPP as ENOTSUP.
func errnoByName(name string) unix.Errno {
	if name == "EOPNOTSUPP" {
		return unix.EOPNOTSUPP
	}
	for e := unix.Errno(1); e < 4096; e++ {
		if unix.ErrnoName(e) == name {
			return e
		}
	}
	return 0
}

func TestErrorValuesAreDistinct(t *testing.T) {
	seen := map[error]unix.Errno{}
	for errno, err := range errnoErrors {
		if other, dup := seen[err]; dup {
			t.Errorf("%v and %v map to the same error", errno, other)
		}
		seen[err] = errno
	}
}

func TestOpErrorMatchesNameAndErrno(t *testing.T) {
	err := opError(0x1000, 0x2000, unix.EBUSY)
	if !errors.Is(err, ErrSourceRunning) {
		t.Errorf("%v does not match ErrSourceRunning", err)
	}
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("%v does not match EBUSY", err)
	}
	if errors.Is(err, ErrNotEmpty) {
		t.Errorf("%v matches ErrNotEmpty", err)
	}
	var op *OpError
	if !errors.As(err, &op) || op.Start != 0x1000 || op.Len != 0x2000 {
		t.Errorf("errors.As(%v) = %+v", err, op)
	}
	want := "cherrypick [0x1000, 0x3000): a thread using the source's memory is neither stopped nor frozen (EBUSY)"
	if err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}

func TestUndocumentedErrnoStillMatches(t *testing.T) {
	err := opError(0, 4096, unix.EIO)
	if !errors.Is(err, unix.EIO) {
		t.Errorf("%v does not match EIO", err)
	}
	for _, named := range errnoErrors {
		if errors.Is(err, named) {
			t.Errorf("%v matches %v", err, named)
		}
	}
}

func TestOpenAbsentDevice(t *testing.T) {
	_, err := OpenPath(filepath.Join(t.TempDir(), "vma_cherrypick"))
	if !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("OpenPath on a missing node: %v, want ErrNotLoaded", err)
	}
}

// A node that does not understand the version ioctl is reported as
// incompatible rather than as a generic failure.
func TestOpenForeignDevice(t *testing.T) {
	_, err := OpenPath("/dev/null")
	if !errors.Is(err, ErrIncompatible) {
		t.Fatalf("OpenPath(/dev/null): %v, want ErrIncompatible", err)
	}
}

func TestProbeWithoutModule(t *testing.T) {
	if _, err := os.Stat(DevicePath); err == nil {
		t.Skipf("%s exists here; the VM suite covers the loaded case", DevicePath)
	}
	if _, err := Probe(); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Probe: %v, want ErrNotLoaded", err)
	}
}

func TestVersionHas(t *testing.T) {
	v := Version{Features: FeatureAnon | FeatureTHP}
	if !v.Has(FeatureAnon) || !v.Has(FeatureAnon|FeatureTHP) {
		t.Error("Has misses reported features")
	}
	if v.Has(FeatureFilePrivate) || v.Has(FeatureAnon|FeatureFilePrivate) {
		t.Error("Has reports a missing feature")
	}
}
