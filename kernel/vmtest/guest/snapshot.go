package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/tclone/tclone/kernel/cherrypick"
	"golang.org/x/sys/unix"
)

// The whole user address space: what a runtime snapshots.
const userSpan = 1<<47 - pageSize

// snapshotFdinfo reads the module's fields from a snapshot's fdinfo.
func snapshotFdinfo(snap *cherrypick.Snapshot) (map[string]uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", snap.File().Fd()))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(k, "vcp_") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("fdinfo %s: %v", line, err)
		}
		out[k] = n
	}
	if _, ok := out["vcp_anon_pages"]; !ok {
		return nil, fmt.Errorf("snapshot fdinfo has no vcp_anon_pages:\n%s", b)
	}
	return out, nil
}

// testSnapshot: a snapshot keeps the pages the source had when it was
// taken while the source runs on and rewrites them; destinations made from
// it afterwards get those pages, shared; closing it frees what only it held.
func testSnapshot(s *suite) error {
	const size = 64 * mib
	const seedA, seedB, holeMod = 0x5a, 0x5b, 8
	src, dst, dst2 := mustSpawn(), mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	defer dst2.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst, dst2); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seedA, holeMod); err != nil {
		return err
	}
	srcArea, err := src.areaAt(addr)
	if err != nil {
		return err
	}
	snap, took, err := s.snapshotStopped(src)
	if err != nil {
		return err
	}
	defer snap.Close()
	fmt.Printf("TIMING 64MiB snapshot of a whole helper=%.1fms (%d areas, %d skipped, %d pages)\n",
		ms(took), snap.Areas, snap.Skipped, snap.AnonPages)
	if snap.Skipped == 0 || snap.Areas == 0 {
		return fmt.Errorf("snapshot of a whole helper took %d areas and skipped %d; want both (its binary and vDSO are not anonymous)", snap.Areas, snap.Skipped)
	}
	if snap.AnonPages*4 < srcArea.anonymous {
		return fmt.Errorf("snapshot holds %d pages, the filled area alone has %d kB", snap.AnonPages, srcArea.anonymous)
	}

	// The source runs on and rewrites every page of the region.
	if err := src.cont(); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seedB, 0); err != nil {
		return err
	}
	if err := expectPattern(src, addr, size, seedB, 0); err != nil {
		return err
	}
	info, err := snapshotFdinfo(snap)
	if err != nil {
		return err
	}
	if info["vcp_anon_pages"] != snap.AnonPages || info["vcp_source_pid"] != uint64(src.pid) {
		return fmt.Errorf("fdinfo %v after the source rewrote its pages; the snapshot took %d pages of pid %d", info, snap.AnonPages, src.pid)
	}

	// Read back, the snapshot still holds them as they were.
	if err := expectSnapshotPattern(snap, addr, size, seedA, holeMod); err != nil {
		return err
	}
	// A gap between areas (just below the region) reads as EFAULT.
	if _, err := unix.Pread(int(snap.File().Fd()), make([]byte, pageSize), int64(addr-pageSize)); err != unix.EFAULT {
		return fmt.Errorf("pread of a snapshot where no area is: %v, want EFAULT", err)
	}

	// A destination made after that gets the pages as they were.
	if err := dst.stop(); err != nil {
		return err
	}
	res, err := s.dev.CherrypickFrom(snap, dst.pidfd, addr, size)
	if err != nil {
		return err
	}
	if res.Areas != 1 || res.AnonPages*4 != srcArea.anonymous {
		return fmt.Errorf("cherrypick from the snapshot: %+v, the source had %d kB", res, srcArea.anonymous)
	}
	if err := expectPattern(dst, addr, size, seedA, holeMod); err != nil {
		return fmt.Errorf("destination of a snapshot: %w", err)
	}
	if err := dst2.stop(); err != nil {
		return err
	}
	if _, err := s.dev.CherrypickFrom(snap, dst2.pidfd, addr, size); err != nil {
		return err
	}
	// Three mappers: the snapshot and both destinations.
	if _, err := checkShared(dst2, addr, 3); err != nil {
		return err
	}
	if err := dst.cont(); err != nil {
		return err
	}
	if err := dst2.cont(); err != nil {
		return err
	}
	// Destinations diverge from each other, and from the snapshot.
	if _, err := dst.do("write %d %d", addr, 0x1234); err != nil {
		return err
	}
	if err := expectPattern(dst2, addr, size, seedA, holeMod); err != nil {
		return fmt.Errorf("a write in one destination of a snapshot showed in another: %w", err)
	}

	// Closed, the snapshot no longer maps what it shared with the
	// destinations (testSnapshotFrees checks what it held alone).
	if err := snap.Close(); err != nil {
		return err
	}
	if _, err := checkShared(dst2, addr, 2); err != nil {
		return fmt.Errorf("after the snapshot closed: %w", err)
	}
	return expectPattern(dst2, addr, size, seedA, holeMod)
}

// testSnapshotFrees: a snapshot alone holding rewritten pages gives them
// back when closed; nothing else stays (page tables, slab, anon_vmas).
func testSnapshotFrees(s *suite) error {
	const size = 128 * mib
	base, err := kernelMemory()
	if err != nil {
		return err
	}
	src := mustSpawn()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src); err != nil {
		src.release()
		return err
	}
	for round := uint64(0); round < 20; round++ {
		if _, err := src.do("fill %d %d %d %d", addr, size/8, round, 0); err != nil {
			src.release()
			return err
		}
		if err := src.stop(); err != nil {
			src.release()
			return err
		}
		snap, err := s.dev.Snapshot(src.pidfd, addr, size)
		if cerr := src.cont(); err == nil {
			err = cerr
		}
		if err != nil {
			src.release()
			return err
		}
		snap.Close()
	}
	// One more, kept while the source rewrites all of it: the old pages
	// are the snapshot's alone, and must go when it closes.
	if _, err := src.do("fill %d %d %d %d", addr, size, 0x77, 0); err != nil {
		src.release()
		return err
	}
	if err := src.stop(); err != nil {
		src.release()
		return err
	}
	snap, err := s.dev.Snapshot(src.pidfd, addr, size)
	src.cont()
	if err != nil {
		src.release()
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, 0x78, 0); err != nil {
		src.release()
		return err
	}
	held, _ := meminfo("AnonPages")
	snap.Close()
	freed, _ := meminfo("AnonPages")
	src.release()
	fmt.Printf("  snapshot of %d MiB, rewritten by the source: AnonPages %d -> %d kB when closed\n", size/mib, held, freed)
	if held < freed+size/kib*9/10 {
		return fmt.Errorf("closing a snapshot whose %d MiB the source had rewritten freed only %d kB", size/mib, held-min(held, freed))
	}
	after, err := settledKernelMemory(base)
	if err != nil {
		return err
	}
	return after.within(base)
}

// testSnapshotRefusals: what a snapshot refuses, each with its own errno.
func testSnapshotRefusals(s *suite) error {
	const size = 4 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, 0x9, 0); err != nil {
		return err
	}
	check := func(what string, want error, err error) error {
		if !errors.Is(err, want) {
			return fmt.Errorf("%s: got %v, want %v", what, err, want)
		}
		return nil
	}
	_, err := s.dev.Snapshot(src.pidfd, addr, size)
	if err := check("running source", cherrypick.ErrNotParked, err); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	_, err = s.dev.Snapshot(src.pidfd, addr+pageSize, size-2*pageSize)
	if err := check("range inside an area", cherrypick.ErrLayoutMismatch, err); err != nil {
		return err
	}
	_, err = s.dev.Snapshot(src.pidfd, addr+1, size)
	if err := check("unaligned start", cherrypick.ErrInvalid, err); err != nil {
		return err
	}
	_, err = s.dev.Snapshot(-1, addr, size)
	if err := check("no pidfd", cherrypick.ErrNotPidfd, err); err != nil {
		return err
	}
	// A range holding only a file-backed area (the helper's executable):
	// nothing a snapshot can take.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	exe, found, err := src.areaNamed(self)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("helper %d maps no area of %s", src.pid, self)
	}
	_, err = s.dev.Snapshot(src.pidfd, exe.start, exe.end-exe.start)
	if err := check("file-backed only", cherrypick.ErrLayoutMismatch, err); err != nil {
		return err
	}

	snap, err := s.dev.Snapshot(src.pidfd, addr, size)
	if err != nil {
		return err
	}
	defer snap.Close()
	if err := dst.stop(); err != nil {
		return err
	}
	// A destination that already holds the pages (a plain cherrypick).
	if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, addr, size); err != nil {
		return fmt.Errorf("plain cherrypick beside a snapshot: %v", err)
	}
	dst2 := mustSpawn()
	defer dst2.release()
	if err := mapBoth(addr, size, madvNoHugepage, dst2); err != nil {
		return err
	}
	if err := dst2.stop(); err != nil {
		return err
	}
	// The destination's layout must match the snapshot's.
	_, err = s.dev.CherrypickFrom(snap, dst2.pidfd, addr, size/2)
	if err := check("range cutting the snapshot's area", cherrypick.ErrLayoutMismatch, err); err != nil {
		return err
	}
	_, err = s.dev.CherrypickFrom(snap, dst.pidfd, addr, size)
	if err := check("destination already holding memory", cherrypick.ErrNotEmpty, err); err != nil {
		return err
	}
	// A running destination.
	if err := dst2.cont(); err != nil {
		return err
	}
	_, err = s.dev.CherrypickFrom(snap, dst2.pidfd, addr, size)
	if err := check("running destination", cherrypick.ErrNotParked, err); err != nil {
		return err
	}
	// The source may run, and even exit: the snapshot needs neither.
	if err := src.cont(); err != nil {
		return err
	}
	src.kill()
	if err := dst2.stop(); err != nil {
		return err
	}
	if _, err := s.dev.CherrypickFrom(snap, dst2.pidfd, addr, size); err != nil {
		return fmt.Errorf("cherrypick from the snapshot of a source that exited: %v", err)
	}
	return expectPattern(dst2, addr, size, 0x9, 0)
}

// testSnapshotDevice drives the ioctls by hand, as the bindings never
// would: the device opened for reading only takes no snapshot, an unknown
// flag is refused, and a pidfd is not a snapshot.
func testSnapshotDevice(s *suite) error {
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	const size = 2 * mib
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	if err := dst.stop(); err != nil {
		return err
	}
	ioctl := func(mode int, req uintptr, args []byte) unix.Errno {
		f, err := os.OpenFile(cherrypick.DevicePath, mode, 0)
		if err != nil {
			return unix.ENODEV
		}
		defer f.Close()
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(unsafe.Pointer(&args[0])))
		return errno
	}
	const iocSnapshot, iocCherrypick = 0xC040E402, 0xC038E401
	snap := make([]byte, 64)
	putUint32(snap[0:], uint32(src.pidfd))
	putUint64(snap[8:], addr)
	putUint64(snap[16:], size)
	if errno := ioctl(os.O_RDONLY, iocSnapshot, snap); errno != unix.EBADF {
		return fmt.Errorf("snapshot through a read-only descriptor: errno %v, want EBADF", errno)
	}
	putUint32(snap[4:], 1)
	if errno := ioctl(os.O_RDWR, iocSnapshot, snap); errno != unix.EINVAL {
		return fmt.Errorf("snapshot with an unknown flag: errno %v, want EINVAL", errno)
	}
	pick := make([]byte, 56)
	putUint32(pick[0:], uint32(src.pidfd))
	putUint32(pick[4:], uint32(dst.pidfd))
	putUint64(pick[8:], addr)
	putUint64(pick[16:], size)
	putUint64(pick[24:], 1) // VCP_CHERRYPICK_SRC_SNAPSHOT, with a pidfd
	if errno := ioctl(os.O_RDWR, iocCherrypick, pick); errno != unix.EBADF {
		return fmt.Errorf("cherrypick from a pidfd flagged as a snapshot: errno %v, want EBADF", errno)
	}
	putUint64(pick[24:], 2)
	if errno := ioctl(os.O_RDWR, iocCherrypick, pick); errno != unix.EINVAL {
		return fmt.Errorf("cherrypick with an unknown flag: errno %v, want EINVAL", errno)
	}
	return nil
}

func putUint32(b []byte, v uint32) {
	for i := 0; i < 4; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

// testSnapshotBenchmark: the time to snapshot 1 GiB next to fork() of the
// same memory, in the same helper.
func testSnapshotBenchmark(s *suite) error {
	const size = 1 * gib
	src := mustSpawn()
	defer src.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, 0x3, 0); err != nil {
		return err
	}
	forkNs, err := src.doUint("forktime")
	if err != nil {
		return err
	}
	snap, took, err := s.snapshotStopped(src)
	if err != nil {
		return err
	}
	defer snap.Close()
	if snap.AnonPages < size/pageSize {
		return fmt.Errorf("snapshot holds %d pages, want at least %d", snap.AnonPages, size/pageSize)
	}
	fmt.Printf("TIMING 1GiB snapshot=%.1fms fork=%.1fms (4 KiB pages)\n", ms(took), float64(forkNs)/1e6)
	return src.cont()
}

// expectSnapshotPattern reads a snapshot's range with pread and checks it
// against what fill wrote, as expectPattern checks a helper's memory.
func expectSnapshotPattern(snap *cherrypick.Snapshot, addr, size, seed, holeMod uint64) error {
	const chunk = 4 * mib
	buf := make([]byte, chunk)
	want := make([]byte, pageSize)
	for off := uint64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		// An unaligned start, so that reads cross pages.
		got, err := unix.Pread(int(snap.File().Fd()), buf[:n], int64(addr+off))
		if err != nil || uint64(got) != n {
			return fmt.Errorf("pread of the snapshot at %#x: %d bytes, %v", addr+off, got, err)
		}
		for pg := uint64(0); pg < n/pageSize; pg++ {
			page := uintptr(off/pageSize + pg)
			clear(want)
			if !isHole(seed, page, holeMod) {
				for w := uintptr(0); w < wordsPerPage; w++ {
					putUint64(want[w*512:], pattern(seed, page, w))
				}
			}
			if !bytes.Equal(buf[pg*pageSize:(pg+1)*pageSize], want) {
				return fmt.Errorf("the snapshot's page %#x (hole=%v) does not hold what the source had", addr+uint64(page)*pageSize, isHole(seed, page, holeMod))
			}
		}
	}
	// A read that starts inside a page and ends in the next.
	two := make([]byte, pageSize)
	if n, err := unix.Pread(int(snap.File().Fd()), two, int64(addr+pageSize/2)); err != nil || n != pageSize {
		return fmt.Errorf("pread across a page boundary: %d bytes, %v", n, err)
	}
	return nil
}

// snapshotStopped stops src and snapshots its whole address space, timing
// the call alone.
func (s *suite) snapshotStopped(src *proc) (*cherrypick.Snapshot, time.Duration, error) {
	if err := src.stop(); err != nil {
		return nil, 0, err
	}
	start := time.Now()
	snap, err := s.dev.Snapshot(src.pidfd, 0, userSpan)
	return snap, time.Since(start), err
}

// holdSnapshot is init.sh's unload check: it takes a snapshot of a helper,
// closes the device, lets the helper go, writes ready, and holds the
// snapshot until SIGTERM. Meanwhile the module must refuse to unload: the
// snapshot's release runs the module's code.
func holdSnapshot(ready string) int {
	const size = 8 * mib
	src := mustSpawn()
	s := &suite{nextAddr: 0x100000000000}
	addr := s.region(size)
	fail := func(err error) int {
		fmt.Printf("hold-snapshot: %v\n", err)
		src.release()
		return 1
	}
	if err := mapBoth(addr, size, madvNoHugepage, src); err != nil {
		return fail(err)
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, 0x44, 0); err != nil {
		return fail(err)
	}
	dev, err := cherrypick.Open()
	if err != nil {
		return fail(err)
	}
	s.dev = dev
	snap, _, err := s.snapshotStopped(src)
	dev.Close()
	if err != nil {
		return fail(err)
	}
	src.release()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGTERM)
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		return fail(err)
	}
	<-sig
	if err := expectSnapshotPattern(snap, addr, size, 0x44, 0); err != nil {
		fmt.Printf("hold-snapshot: %v\n", err)
		return 1
	}
	if err := snap.Close(); err != nil {
		fmt.Printf("hold-snapshot: %v\n", err)
		return 1
	}
	return 0
}
