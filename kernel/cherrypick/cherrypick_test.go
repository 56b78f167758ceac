package cherrypick

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"testing"

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

// cField is one member of a uapi struct as the header declares it.
type cField struct {
	name   string
	size   uintptr
	offset uintptr
}

var uapiSizes = map[string]uintptr{"__u8": 1, "__s8": 1, "__u16": 2, "__s16": 2, "__u32": 4, "__s32": 4, "__u64": 8, "__s64": 8}

// headerStruct lays out `struct name` from the header with the x86-64 C
// rules (each member aligned to its size, the struct to its largest member).
func headerStruct(t *testing.T, header, name string) ([]cField, uintptr) {
	t.Helper()
	m := regexp.MustCompile(`(?s)struct\s+` + name + `\s*\{(.*?)\};`).FindStringSubmatch(header)
	if m == nil {
		t.Fatalf("struct %s not found in %s", name, headerPath)
	}
	var fields []cField
	var off, align uintptr = 0, 1
	for _, fm := range regexp.MustCompile(`(?m)^\s*(\w+)\s+(\w+);`).FindAllStringSubmatch(m[1], -1) {
		size, ok := uapiSizes[fm[1]]
		if !ok {
			t.Fatalf("struct %s member %s has type %s, which this test cannot size", name, fm[2], fm[1])
		}
		off = (off + size - 1) / size * size
		fields = append(fields, cField{name: fm[2], size: size, offset: off})
		off += size
		align = max(align, size)
	}
	return fields, (off + align - 1) / align * align
}

// checkGoStruct compares a Go mirror with the header's struct member by member.
func checkGoStruct(t *testing.T, header, name string, goValue any) uintptr {
	t.Helper()
	fields, size := headerStruct(t, header, name)
	typ := reflect.TypeOf(goValue)
	if typ.NumField() != len(fields) {
		t.Fatalf("struct %s has %d members in the header, %s has %d", name, len(fields), typ.Name(), typ.NumField())
	}
	for i, f := range fields {
		g := typ.Field(i)
		if g.Offset != f.offset || g.Type.Size() != f.size {
			t.Errorf("struct %s.%s: header offset %d size %d; Go %s.%s offset %d size %d",
				name, f.name, f.offset, f.size, typ.Name(), g.Name, g.Offset, g.Type.Size())
		}
	}
	if typ.Size() != size {
		t.Errorf("struct %s: header %d bytes, Go %s %d bytes", name, size, typ.Name(), typ.Size())
	}
	return size
}

func TestStructLayoutMatchesHeader(t *testing.T) {
	h := readHeader(t)
	checkGoStruct(t, h, "vcp_version", versionArgs{})
	checkGoStruct(t, h, "vcp_cherrypick", cherrypickArgs{})
	checkGoStruct(t, h, "vcp_snapshot", snapshotArgs{})
}

// The ioctl numbers are computed from the header's _IOR/_IOWR lines and the
// struct sizes the header implies, not from the Go definitions.
func TestIoctlNumbersMatchHeader(t *testing.T) {
	h := readHeader(t)
	magic := headerDefine(t, h, "VCP_IOC_MAGIC")
	for name, got := range map[string]uintptr{"VCP_IOC_VERSION": iocVersion, "VCP_IOC_CHERRYPICK": iocCherrypick, "VCP_IOC_SNAPSHOT": iocSnapshot} {
		m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+_IO(R|W|WR)\(VCP_IOC_MAGIC,\s*(0x[0-9A-Fa-f]+|\d+),\s*struct\s+(\w+)\)`).FindStringSubmatch(h)
		if m == nil {
			t.Fatalf("%s is not an _IOR/_IOW/_IOWR of VCP_IOC_MAGIC in %s", name, headerPath)
		}
		nr, _ := strconv.ParseUint(m[2], 0, 8)
		_, size := headerStruct(t, h, m[3])
		dir := map[string]uintptr{"R": iocRead, "W": iocWrite, "WR": iocRead | iocWrite}[m[1]]
		if want := ioc(dir, uintptr(magic), uintptr(nr), size); got != want {
			t.Errorf("%s: Go %#x, header %#x", name, got, want)
		}
	}
	// And the values the C preprocessor computes on x86-64, as a fixed point.
	if iocVersion != 0x8010E400 || iocCherrypick != 0xC038E401 || iocSnapshot != 0xC040E402 {
		t.Errorf("ioctl numbers %#x, %#x, %#x; want 0x8010e400, 0xc038e401, 0xc040e402", iocVersion, iocCherrypick, iocSnapshot)
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
		"VCP_FEATURE_SNAPSHOT":     FeatureSnapshot,
	} {
		if got := headerDefine(t, h, name); Features(got) != want {
			t.Errorf("%s: header %#x, Go %#x", name, got, want)
		}
	}
	for name, want := range map[string]uint64{"VCP_CHERRYPICK_SRC_SNAPSHOT": flagSrcSnapshot} {
		if got := headerDefine(t, h, name); got != want {
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
	err := opError("cherrypick", 0x1000, 0x2000, unix.EBUSY)
	if !errors.Is(err, ErrNotParked) {
		t.Errorf("%v does not match ErrNotParked", err)
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
	want := "cherrypick [0x1000, 0x3000): a thread using the source's or the destination's memory is neither stopped nor frozen (EBUSY)"
	if err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}

func TestUndocumentedErrnoStillMatches(t *testing.T) {
	err := opError("snapshot", 0, 4096, unix.EIO)
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
		// The host has no module support, so this never skips there.
		t.Skipf("%s exists here; the VM suite covers the loaded case", DevicePath) // testenv: skip allowed: never on the host
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
