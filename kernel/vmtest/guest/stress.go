package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

const (
	stressIterations = 200
	stressPool       = 5
)

// testStress repeats the whole cycle with random sizes, THP advice, hole
// density, fan-out, writes and exits. Helpers live across iterations and
// are killed at random; killed ones are replaced. At the end all are gone and
// the system's anonymous memory must be back where it started: a leaked
// page or reference would show up there or as a "bad page" in dmesg.
func testStress(s *suite) error {
	anonBefore, err := othersAnon()
	if err != nil {
		return err
	}
	kernelBefore, err := kernelMemory()
	if err != nil {
		return err
	}
	pool := make([]*proc, stressPool)
	for i := range pool {
		pool[i] = mustSpawn()
	}
	defer func() {
		for _, p := range pool {
			p.release()
		}
	}()
	start := time.Now()
	for it := 0; it < stressIterations; it++ {
		if err := stressOnce(s, pool, it); err != nil {
			return fmt.Errorf("iteration %d: %w", it, err)
		}
	}
	for _, p := range pool {
		p.release()
	}
	// Freed pages go back through per-CPU batches; give the last exits a
	// moment before measuring.
	var anonAfter uint64
	for try := 0; try < 50; try++ {
		if anonAfter, err = othersAnon(); err != nil {
			return err
		}
		if anonAfter <= anonBefore+leakSlackKiB {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("stress: %d iterations in %v; anonymous memory outside the suite %d kB before, %d kB after\n",
		stressIterations, time.Since(start).Round(time.Millisecond), anonBefore, anonAfter)
	if anonAfter > anonBefore+leakSlackKiB {
		return fmt.Errorf("anonymous memory outside the suite grew from %d to %d kB with every helper gone: pages leaked", anonBefore, anonAfter)
	}
	kernelAfter, err := settledKernelMemory(kernelBefore)
	if err != nil {
		return err
	}
	fmt.Printf("stress: page tables outside the suite %d kB before, %d kB after; unreclaimable slab %d kB, %d kB (%d kB, %d kB before the caches were shrunk, in %v); anon_vma objects %d, %d\n",
		kernelBefore.pageTables, kernelAfter.pageTables, kernelBefore.slab, kernelAfter.slab,
		kernelBefore.slabUnshrunk, kernelAfter.slabUnshrunk, kernelAfter.shrinkTook.Round(time.Millisecond),
		kernelBefore.anonVMAs, kernelAfter.anonVMAs)
	return kernelAfter.within(kernelBefore)
}

// kernelMem is what the kernel allocates for processes' memory maps, less
// the suite's own page tables: with every helper gone it must be back.
// slab is measured with every cache shrunk (shrinkSlabs); slabUnshrunk, and
// how long the shrinking took, are only reported.
type kernelMem struct {
	pageTables, slab, anonVMAs uint64
	slabUnshrunk               uint64
	shrinkTook                 time.Duration
}

// Slack for what the rest of the system does meanwhile (kB, objects).
const (
	pageTableSlackKiB = 256
	slabSlackKiB      = 4096
	anonVMASlack      = 64
)

func (k kernelMem) within(before kernelMem) error {
	switch {
	case k.pageTables > before.pageTables+pageTableSlackKiB:
		return fmt.Errorf("page tables outside the suite grew from %d to %d kB with every helper gone: page tables leaked", before.pageTables, k.pageTables)
	case k.slab > before.slab+slabSlackKiB:
		return fmt.Errorf("unreclaimable slab grew from %d to %d kB with every helper gone", before.slab, k.slab)
	case k.anonVMAs > before.anonVMAs+anonVMASlack:
		return fmt.Errorf("anon_vma objects grew from %d to %d with every helper gone: anon_vmas leaked", before.anonVMAs, k.anonVMAs)
	}
	return nil
}

// settledKernelMemory measures kernelMemory until it is back within base's
// slack, for up to five seconds: the kernel frees an exited helper's page
// tables and slab through RCU and per-CPU batches, which under TCG can
// still hold them when its exit was reaped. The last measurement is
// returned either way.
func settledKernelMemory(base kernelMem) (kernelMem, error) {
	var k kernelMem
	var err error
	for try := 0; try < 50; try++ {
		if k, err = kernelMemory(); err != nil {
			return k, err
		}
		if k.within(base) == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return k, nil
}

func kernelMemory() (kernelMem, error) {
	var k kernelMem
	var err error
	if k.pageTables, err = meminfo("PageTables"); err != nil {
		return k, err
	}
	if k.slabUnshrunk, err = meminfo("SUnreclaim"); err != nil {
		return k, err
	}
	start := time.Now()
	if err := shrinkSlabs(); err != nil {
		return k, err
	}
	k.shrinkTook = time.Since(start)
	if k.slab, err = meminfo("SUnreclaim"); err != nil {
		return k, err
	}
	own, err := selfStatus("VmPTE")
	if err != nil {
		return k, err
	}
	k.pageTables -= min(k.pageTables, own)
	k.anonVMAs, err = slabObjects("anon_vma")
	return k, err
}

// shrinkSlabs shrinks every slab cache (kmem_cache_shrink()), so that
// unreclaimable slab counts allocated objects rather than what the
// allocator keeps at hand. SLUB gives back its empty slabs, per-CPU partial
// ones included. On a KASAN kernel (the debug job's) the shrink first frees
// that cache's objects held in KASAN's quarantine (kasan_cache_shrink()):
// freed objects kept allocated, to catch a use after free, until the
// quarantine holds 1/32 of RAM, which the stress test alone fills by tens of
// MB. Objects nobody freed stay allocated and counted, so a leak still
// shows.
func shrinkSlabs() error {
	const dir = "/sys/kernel/slab"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink != 0 {
			continue // another name of a merged cache
		}
		if err := writeFile(dir+"/"+e.Name()+"/shrink", "1"); err != nil {
			return err
		}
	}
	return nil
}

func selfStatus(key string) (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key+":" {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", key)
}

// slabObjects is a slab cache's active object count from /proc/slabinfo.
// anon_vma has a constructor, so SLUB never merges it into another cache.
// SLUB counts the objects of per-CPU slabs as active, free or not; shrinking
// the cache first flushes those, which makes the count exact.
func slabObjects(cache string) (uint64, error) {
	writeFile("/sys/kernel/slab/"+cache+"/shrink", "1")
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == cache {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s cache in /proc/slabinfo", cache)
}

func stressOnce(s *suite, pool []*proc, it int) error {
	r := s.rng
	pages := uint64(1 + r.Intn(1024))
	if r.Intn(4) == 0 {
		pages = uint64(512 * (1 + r.Intn(3))) // whole huge pages
	}
	size := pages * pageSize
	addr := s.region(size)
	seed := r.Uint64()
	holeMod := []uint64{0, 2, 3, 16}[r.Intn(4)]
	advice := []int{0, madvHugepage, madvNoHugepage}[r.Intn(3)]

	perm := r.Perm(len(pool))
	src := pool[perm[0]]
	dsts := []*proc{}
	for _, i := range perm[1 : 2+r.Intn(2)] {
		dsts = append(dsts, pool[i])
	}
	everyone := append([]*proc{src}, dsts...)
	if err := mapBoth(addr, size, advice, everyone...); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seed, holeMod); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	for _, d := range dsts {
		res, _, err := s.cherrypick(src, d, addr, size)
		if err != nil {
			return err
		}
		if res.Areas != 1 {
			return fmt.Errorf("%d areas, want 1", res.Areas)
		}
	}
	if err := src.cont(); err != nil {
		return err
	}
	// Everyone holds the original content.
	for _, p := range everyone {
		if err := expectPattern(p, addr, size, seed, holeMod); err != nil {
			return err
		}
	}
	// Random writes: each is seen by its writer only, every other process
	// keeps the value it had.
	for w := 0; w < 1+r.Intn(4); w++ {
		who := everyone[r.Intn(len(everyone))]
		at := addr + uint64(r.Intn(int(size/8)))*8
		before := make([]uint64, len(everyone))
		for i, p := range everyone {
			v, err := readWord(p, at)
			if err != nil {
				return err
			}
			before[i] = v
		}
		val := r.Uint64()
		if _, err := who.do("write %d %d", at, val); err != nil {
			return err
		}
		for i, p := range everyone {
			want := before[i]
			if p == who {
				want = val
			}
			got, err := readWord(p, at)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("after helper %d wrote %#x at %#x, helper %d reads %#x, want %#x", who.pid, val, at, p.pid, got, want)
			}
		}
	}
	// Random exits, replaced by fresh helpers; survivors unmap.
	for _, p := range everyone {
		if r.Intn(4) == 0 {
			p.release()
			for i := range pool {
				if pool[i] == p {
					pool[i] = mustSpawn()
				}
			}
			continue
		}
		if _, err := p.do("unmap %d %d", addr, size); err != nil {
			return err
		}
	}
	return nil
}

// leakSlackKiB absorbs what busybox init and per-CPU page lists may hold.
const leakSlackKiB = 2048

// othersAnon is the system's anonymous memory minus the suite's own (its Go
// heap grows and shrinks with the buffers it uses): with no helper alive,
// what remains must not grow.
func othersAnon() (uint64, error) {
	runtime.GC()
	debug.FreeOSMemory()
	total, err := meminfo("AnonPages")
	if err != nil {
		return 0, err
	}
	own, err := selfStatus("RssAnon")
	if err != nil {
		return 0, err
	}
	return total - min(total, own), nil
}

func readWord(p *proc, at uint64) (uint64, error) {
	var buf [8]byte
	if err := p.readMem(at, buf[:]); err != nil {
		return 0, err
	}
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(buf[i])
	}
	return v, nil
}
