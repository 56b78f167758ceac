package main

import (
	"bytes"
	"fmt"

	"golang.org/x/sys/unix"
)

// memfdFill is every byte of a helper's memfd before it is written through
// its private mapping: what a page never written there reads.
const memfdFill = 0x3c

// testSnapshotFileAreas: a workload holding memory that looks anonymous but
// has a file (a private mapping of /dev/zero: no vm_ops, vm_file set) and
// a private memfd mapping (vm_ops and a file) is snapshotted and forked,
// as a copy-on-write fork does it. The /dev/zero area is anonymous memory
// and is taken, but its copy must hold no file: vm_area_dup() copies
// vm_file and the file's interval-tree node without a reference or an
// insertion, and releasing the snapshot would then fput() a reference it
// never took and erase a node from /dev/zero's i_mmap tree. The memfd area
// is file-backed and left out of the snapshot (a cherrypick from the
// process itself shares only its copied-on-write pages). The source closes
// both files right after mapping them, so its areas hold the only
// references: an unbalanced fput() frees a file still mapped, which the
// source's later munmap then uses (KASAN's use-after-free, or the
// "imbalanced put" warning of 7.x's file_ref_t, in the kernel log the run
// checks).
func testSnapshotFileAreas(s *suite) error {
	const size = 4 * mib
	const seedA, seedZ, seedM, seedLater, holeMod = 0x61, 0x62, 0x63, 0x64, 8
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	anon, zero, memfd := s.region(size), s.region(size), s.region(size)
	// The destination maps what CRIU restores there: anonymous memory for
	// the anonymous area, /dev/zero privately for the /dev/zero one (CRIU
	// may restore it either way; an anonymous twin is checked by the
	// anonymous area), and a memfd of its own with the same contents.
	for _, p := range []*proc{src, dst} {
		for _, m := range []string{
			fmt.Sprintf("map %d %d anon rw", anon, size),
			fmt.Sprintf("map %d %d file rw /dev/zero", zero, size),
			fmt.Sprintf("map %d %d memfd rw", memfd, size),
		} {
			if _, err := p.do("%s", m); err != nil {
				return err
			}
		}
		for _, a := range []uint64{anon, zero, memfd} {
			if _, err := p.do("madvise %d %d %d", a, size, madvNoHugepage); err != nil {
				return err
			}
		}
	}
	for a, seed := range map[uint64]uint64{anon: seedA, zero: seedZ, memfd: seedM} {
		if _, err := src.do("fill %d %d %d %d", a, size, seed, holeMod); err != nil {
			return err
		}
	}
	zeroArea, err := src.areaAt(zero)
	if err != nil {
		return err
	}
	if zeroArea.name != "/dev/zero" {
		return fmt.Errorf("helper %d maps %q at %#x, want /dev/zero", src.pid, zeroArea.name, zero)
	}

	// The fork: a snapshot of the stopped source, and the file-backed area
	// cherrypicked from the source itself while it is still stopped.
	snap, _, err := s.snapshotStopped(src)
	if err != nil {
		return err
	}
	defer snap.Close()
	if err := expectSnapshotPattern(snap, zero, size, seedZ, holeMod); err != nil {
		return fmt.Errorf("the snapshot of the /dev/zero area: %w", err)
	}
	if err := expectSnapshotPattern(snap, anon, size, seedA, holeMod); err != nil {
		return err
	}
	if _, err := unix.Pread(int(snap.File().Fd()), make([]byte, pageSize), int64(memfd)); err != unix.EFAULT {
		return fmt.Errorf("pread of the snapshot in the memfd area: %v, want EFAULT (a file-backed area is not taken)", err)
	}
	if err := dst.stop(); err != nil {
		return err
	}
	res, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, memfd, size)
	if err != nil {
		return fmt.Errorf("cherrypick of the private memfd area: %w", err)
	}
	written := uint64(0)
	for pg := uintptr(0); pg < size/pageSize; pg++ {
		if !isHole(seedM, pg, holeMod) {
			written++
		}
	}
	if res.AnonPages != written {
		return fmt.Errorf("cherrypick of the memfd area shared %d anonymous pages, the source wrote %d", res.AnonPages, written)
	}
	for _, a := range []uint64{anon, zero} {
		if _, err := s.dev.CherrypickFrom(snap, dst.pidfd, a, size); err != nil {
			return fmt.Errorf("cherrypick from the snapshot at %#x: %w", a, err)
		}
	}
	if err := src.cont(); err != nil {
		return err
	}
	if err := dst.cont(); err != nil {
		return err
	}
	if err := expectPattern(dst, zero, size, seedZ, holeMod); err != nil {
		return fmt.Errorf("the destination's /dev/zero area: %w", err)
	}
	if err := expectPattern(dst, anon, size, seedA, holeMod); err != nil {
		return err
	}
	if err := sameMemory(src, dst, memfd, size); err != nil {
		return fmt.Errorf("the destination's memfd area: %w", err)
	}
	if err := expectFill(dst, memfd, size, seedM, holeMod, memfdFill); err != nil {
		return err
	}

	// The source runs on, rewrites, and lets its areas go only after the
	// snapshot has been released: with a reference too few, that munmap is
	// the use after free.
	if _, err := src.do("fill %d %d %d %d", zero, size, seedLater, 0); err != nil {
		return err
	}
	if err := expectSnapshotPattern(snap, zero, size, seedZ, holeMod); err != nil {
		return fmt.Errorf("the snapshot after the source rewrote its /dev/zero area: %w", err)
	}
	if err := snap.Close(); err != nil {
		return err
	}
	if err := expectPattern(src, zero, size, seedLater, 0); err != nil {
		return fmt.Errorf("the source's /dev/zero area after the snapshot was released: %w", err)
	}
	for _, a := range []uint64{zero, memfd, anon} {
		if _, err := src.do("unmap %d %d", a, size); err != nil {
			return err
		}
	}
	if err := expectPattern(dst, zero, size, seedZ, holeMod); err != nil {
		return fmt.Errorf("the destination's /dev/zero area after the source unmapped its own: %w", err)
	}
	return expectFill(dst, memfd, size, seedM, holeMod, memfdFill)
}

// expectFill checks an area filled with a pattern over a file's contents:
// every byte fill except the pattern's words on the pages written.
func expectFill(p *proc, addr, size, seed, holeMod uint64, fill byte) error {
	buf := make([]byte, pageSize)
	for pg := uintptr(0); pg < uintptr(size/pageSize); pg++ {
		if err := p.readMem(addr+uint64(pg)*pageSize, buf); err != nil {
			return err
		}
		want := bytes.Repeat([]byte{fill}, pageSize)
		if !isHole(seed, pg, holeMod) {
			for w := uintptr(0); w < wordsPerPage; w++ {
				putUint64(want[w*512:], pattern(seed, pg, w))
			}
		}
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("helper %d page %#x (hole=%v) does not hold the pattern over the file's %#x bytes", p.pid, addr+uint64(pg)*pageSize, isHole(seed, pg, holeMod), fill)
		}
	}
	return nil
}
