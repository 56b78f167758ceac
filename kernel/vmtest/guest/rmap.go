package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// The kernel finds every mapping of an anonymous page through its anon_vma
// (rmap): reclaim, migration and THP splitting must reach the destination's
// mappings exactly as they reach a forked child's, or they would fail, or
// free a page the destination still maps. These tests make the kernel do
// each of them on pages a cherrypick shared, then check the content on both
// sides and that the pages are still shared.

func swapOn() bool {
	b, err := os.ReadFile("/proc/swaps")
	return err == nil && len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1
}

// sharedPair is a source and a destination with three areas shared: THP,
// 4 KiB pages, and an area the source moved with mremap() after filling it.
type sharedPair struct {
	src, dst           *proc
	thp, small, moved  uint64
	thpSize, smallSize uint64
	movedSize          uint64
}

func (sp *sharedPair) check(what string) error {
	for _, p := range []*proc{sp.src, sp.dst} {
		if err := expectPattern(p, sp.thp, sp.thpSize, 41, 0); err != nil {
			return fmt.Errorf("after %s: %w", what, err)
		}
		if err := expectPattern(p, sp.small, sp.smallSize, 42, 5); err != nil {
			return fmt.Errorf("after %s: %w", what, err)
		}
		if err := expectPattern(p, sp.moved, sp.movedSize, 43, 0); err != nil {
			return fmt.Errorf("after %s: %w", what, err)
		}
	}
	for _, at := range []uint64{sp.thp, sp.small, sp.moved} {
		if _, err := checkShared(sp.dst, at, 2); err != nil {
			return fmt.Errorf("after %s: %w", what, err)
		}
	}
	return nil
}

func newSharedPair(s *suite) (*sharedPair, error) {
	sp := &sharedPair{src: mustSpawn(), dst: mustSpawn(), thpSize: 8 * mib, smallSize: 8 * mib, movedSize: 4 * mib}
	sp.thp, sp.small, sp.moved = s.region(sp.thpSize), s.region(sp.smallSize), s.region(sp.movedSize)
	if err := cgroupMove("vcp-swap", sp.src.pid); err != nil {
		return sp, err
	}
	if err := mapBoth(sp.thp, sp.thpSize, madvHugepage, sp.src, sp.dst); err != nil {
		return sp, err
	}
	if err := mapBoth(sp.small, sp.smallSize, madvNoHugepage, sp.src, sp.dst); err != nil {
		return sp, err
	}
	// The source's area starts elsewhere and is moved into place: its
	// anon_vma and vm_pgoff keep the old address.
	away := s.region(sp.movedSize)
	if _, err := sp.src.do("map %d %d anon rw", away, sp.movedSize); err != nil {
		return sp, err
	}
	if _, err := sp.dst.do("map %d %d anon rw", sp.moved, sp.movedSize); err != nil {
		return sp, err
	}
	steps := []string{
		fmt.Sprintf("fill %d %d 41 0", sp.thp, sp.thpSize),
		fmt.Sprintf("fill %d %d 42 5", sp.small, sp.smallSize),
		fmt.Sprintf("madvise %d %d %d", away, sp.movedSize, madvNoHugepage),
		fmt.Sprintf("fill %d %d 43 0", away, sp.movedSize),
		fmt.Sprintf("mremap %d %d %d", away, sp.movedSize, sp.moved),
	}
	for _, st := range steps {
		if _, err := sp.src.do("%s", st); err != nil {
			return sp, err
		}
	}
	if err := sp.src.stop(); err != nil {
		return sp, err
	}
	for _, a := range [][2]uint64{{sp.thp, sp.thpSize}, {sp.small, sp.smallSize}, {sp.moved, sp.movedSize}} {
		if _, _, err := s.cherrypick(sp.src, sp.dst, a[0], a[1]); err != nil {
			return sp, err
		}
	}
	return sp, nil
}

func testRmap(s *suite) error {
	if err := cgroupSetup("vcp-swap"); err != nil {
		return err
	}
	sp, err := newSharedPair(s)
	defer sp.src.release()
	defer sp.dst.release()
	if err != nil {
		return err
	}
	if a, err := sp.dst.areaAt(sp.thp); err != nil || a.anonHuge == 0 {
		return fmt.Errorf("the destination got no huge pages to split (%v)", err)
	}
	if err := sp.check("sharing (mremap'ed source included)"); err != nil {
		return err
	}
	start := time.Now()
	step := func(what string) {
		fmt.Printf("  rmap: %s done at %v\n", what, time.Since(start).Round(time.Millisecond))
	}
	// Compaction migrates pages: every mapping must follow.
	if err := writeFile("/proc/sys/vm/compact_memory", "1"); err != nil {
		return err
	}
	if err := sp.check("compaction"); err != nil {
		return err
	}
	step("compaction")
	if err := splitTHP(sp); err != nil {
		return err
	}
	step("THP split")
	if !swapOn() {
		return fmt.Errorf("no swap device in the VM (kernel/vmtest/run.sh attaches one)")
	}
	if err := reclaimShared(sp); err != nil {
		return err
	}
	step("reclaim to swap")
	if err := swappedSource(s); err != nil {
		return err
	}
	step("swapped source")
	return nil
}

// splitTHP splits the source's huge pages through debugfs: the split has to
// unmap and remap every mapping, the destination's included.
func splitTHP(sp *sharedPair) error {
	if err := mountFS("debugfs", "/sys/kernel/debug", "debugfs"); err != nil {
		return err
	}
	req := fmt.Sprintf("%d,%#x,%#x", sp.src.pid, sp.thp, sp.thp+sp.thpSize)
	if err := writeFile("/sys/kernel/debug/split_huge_pages", req); err != nil {
		return err
	}
	for _, p := range []*proc{sp.src, sp.dst} {
		a, err := p.areaAt(sp.thp)
		if err != nil {
			return err
		}
		if a.anonHuge != 0 {
			return fmt.Errorf("after splitting, helper %d still maps %d kB as huge pages", p.pid, a.anonHuge)
		}
	}
	return sp.check("splitting the huge pages")
}

// reclaimShared pushes the source's cgroup to reclaim: shared pages go to
// swap only if rmap unmapped them from the destination as well.
func reclaimShared(sp *sharedPair) error {
	var a area
	err := waitFor(20*time.Second, func() (bool, error) {
		writeFile(cgroupRoot+"/vcp-swap/memory.reclaim", "64M") // EAGAIN when short of the goal
		var err error
		a, err = sp.dst.areaAt(sp.small)
		return a.swap >= sp.smallSize/kib/2, err
	})
	if err != nil {
		return fmt.Errorf("reclaim did not swap out the shared pages (destination Swap %d kB of %d kB): %w", a.swap, sp.smallSize/kib, err)
	}
	fmt.Printf("  reclaim: destination area has %d kB in swap\n", a.swap)
	for _, p := range []*proc{sp.src, sp.dst} {
		if err := expectPattern(p, sp.small, sp.smallSize, 42, 5); err != nil {
			return fmt.Errorf("after swapping out: %w", err)
		}
		if err := expectPattern(p, sp.moved, sp.movedSize, 43, 0); err != nil {
			return fmt.Errorf("after swapping out: %w", err)
		}
	}
	return nil
}

// swappedSource shares a source whose pages are in swap: the destination
// gets swap entries, and reads the content back in.
func swappedSource(s *suite) error {
	const size = 4 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	if err := cgroupMove("vcp-swap", src.pid); err != nil {
		return err
	}
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 44 0", addr, size); err != nil {
		return err
	}
	err := waitFor(20*time.Second, func() (bool, error) {
		writeFile(cgroupRoot+"/vcp-swap/memory.reclaim", "64M")
		a, err := src.areaAt(addr)
		return a.swap >= size/kib/2, err
	})
	if err != nil {
		return fmt.Errorf("the source's pages did not go to swap: %w", err)
	}
	if err := src.stop(); err != nil {
		return err
	}
	res, _, err := s.cherrypick(src, dst, addr, size)
	if err != nil {
		return err
	}
	fmt.Printf("  swapped source: %d swap entries and %d resident pages shared\n", res.SwapEntries, res.AnonPages)
	if res.SwapEntries == 0 || res.SwapEntries+res.AnonPages != size/pageSize {
		return fmt.Errorf("result %+v, want swap entries and %d pages in all", res, size/pageSize)
	}
	if err := expectPattern(dst, addr, size, 44, 0); err != nil {
		return err
	}
	return expectPattern(src, addr, size, 44, 0)
}
