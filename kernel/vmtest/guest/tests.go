package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
)

const (
	madvHugepage   = 14
	madvNoHugepage = 15
	madvDontfork   = 10
	madvWipeonfork = 18
)

func testVersion(s *suite) error {
	v, err := cherrypick.Probe()
	if err != nil {
		return err
	}
	if v.ABI != cherrypick.ABIVersion {
		return fmt.Errorf("ABI %d, want %d", v.ABI, cherrypick.ABIVersion)
	}
	want := cherrypick.FeatureAnon | cherrypick.FeatureFilePrivate | cherrypick.FeatureTHP | cherrypick.FeatureSnapshot
	if !v.Has(want) {
		return fmt.Errorf("features %#x, want %#x", v.Features, want)
	}
	fi, err := os.Stat(cherrypick.DevicePath)
	if err != nil {
		return err
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("%s has mode %v, want a 0600 character device", cherrypick.DevicePath, fi.Mode())
	}
	return nil
}

// mapBoth maps the same anonymous region in every helper, with an optional
// THP advice (0 for none).
func mapBoth(addr, size uint64, advice int, procs ...*proc) error {
	for _, p := range procs {
		if _, err := p.do("map %d %d anon rw", addr, size); err != nil {
			return err
		}
		if advice != 0 {
			if _, err := p.do("madvise %d %d %d", addr, size, advice); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameMemory compares a range of two helpers byte for byte.
func sameMemory(a, b *proc, addr, size uint64) error {
	const chunk = 4 * mib
	bufA := make([]byte, chunk)
	bufB := make([]byte, chunk)
	for off := uint64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		if err := a.readMem(addr+off, bufA[:n]); err != nil {
			return err
		}
		if err := b.readMem(addr+off, bufB[:n]); err != nil {
			return err
		}
		if !bytes.Equal(bufA[:n], bufB[:n]) {
			for i := range bufA[:n] {
				if bufA[i] != bufB[i] {
					return fmt.Errorf("helpers %d and %d differ at %#x", a.pid, b.pid, addr+off+uint64(i))
				}
			}
		}
	}
	return nil
}

// expectPattern checks a helper's range against what fill wrote: the pattern
// words on filled pages, zeroes everywhere else.
func expectPattern(p *proc, addr, size, seed, holeMod uint64) error {
	const chunk = 4 * mib
	buf := make([]byte, chunk)
	for off := uint64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		if err := p.readMem(addr+off, buf[:n]); err != nil {
			return err
		}
		for pg := uint64(0); pg < n/pageSize; pg++ {
			page := uintptr((off / pageSize) + pg)
			data := buf[pg*pageSize : (pg+1)*pageSize]
			want := make([]byte, pageSize)
			if !isHole(seed, page, holeMod) {
				for w := uintptr(0); w < wordsPerPage; w++ {
					putUint64(want[w*512:], pattern(seed, page, w))
				}
			}
			if !bytes.Equal(data, want) {
				return fmt.Errorf("helper %d page %#x (hole=%v) does not hold its pattern", p.pid, addr+uint64(page)*pageSize, isHole(seed, page, holeMod))
			}
		}
	}
	return nil
}

func putUint64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

// checkShared verifies that area a is shared by `mappers` processes: its
// PSS is RSS/mappers (smaps rounds each page's share, hence the slack).
func checkShared(p *proc, addr uint64, mappers uint64) (area, error) {
	a, err := p.areaAt(addr)
	if err != nil {
		return a, err
	}
	if a.rss == 0 {
		return a, fmt.Errorf("helper %d area %#x has no resident pages", p.pid, addr)
	}
	want := a.rss / mappers
	slack := a.rss/50 + 8
	if a.pss+slack < want || a.pss > want+slack {
		return a, fmt.Errorf("helper %d area %#x: Pss %d kB, Rss %d kB; want Pss about Rss/%d = %d kB", p.pid, addr, a.pss, a.rss, mappers, want)
	}
	return a, nil
}

// cherrypick shares [addr, addr+size) of a stopped source with dst. The
// module wants the destination parked too: a running destination is
// stopped for the call and continued after it (one the test stopped itself
// stays stopped). The duration excludes stopping and continuing.
func (s *suite) cherrypick(src, dst *proc, addr, size uint64) (cherrypick.Result, time.Duration, error) {
	if !dst.stopped {
		if err := dst.stop(); err != nil {
			return cherrypick.Result{}, 0, err
		}
		defer dst.cont()
	}
	start := time.Now()
	res, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, addr, size)
	return res, time.Since(start), err
}

// timedCherrypick maps size bytes at addr in both helpers (4 KiB pages),
// fills the source with the seeded pattern (1 page in holeMod left a hole,
// 0 for none), times fork() of the filled source, stops it and cherrypicks.
// It returns the call's result, its duration and fork()'s in nanoseconds.
func (s *suite) timedCherrypick(src, dst *proc, addr, size, seed, holeMod uint64) (cherrypick.Result, time.Duration, uint64, error) {
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return cherrypick.Result{}, 0, 0, err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seed, holeMod); err != nil {
		return cherrypick.Result{}, 0, 0, err
	}
	forkNs, err := src.doUint("forktime")
	if err != nil {
		return cherrypick.Result{}, 0, 0, err
	}
	if err := src.stop(); err != nil {
		return cherrypick.Result{}, 0, 0, err
	}
	res, took, err := s.cherrypick(src, dst, addr, size)
	return res, took, forkNs, err
}

func testContent256(s *suite) error {
	const size = 256 * mib
	const seed, holeMod = 0x256, 8
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	res, took, forkNs, err := s.timedCherrypick(src, dst, addr, size, seed, holeMod)
	if err != nil {
		return err
	}
	fmt.Printf("TIMING 256MiB cherrypick=%.1fms fork=%.1fms (4 KiB pages, %d resident)\n",
		ms(took), float64(forkNs)/1e6, res.AnonPages)

	srcArea, err := checkShared(src, addr, 2)
	if err != nil {
		return err
	}
	dstArea, err := checkShared(dst, addr, 2)
	if err != nil {
		return err
	}
	fmt.Printf("PSS destination: Rss %d kB, Pss %d kB (ratio %.3f)\n", dstArea.rss, dstArea.pss, float64(dstArea.pss)/float64(dstArea.rss))
	if res.Areas != 1 || res.AnonPages*4 != srcArea.anonymous {
		return fmt.Errorf("result %+v, source has %d kB anonymous", res, srcArea.anonymous)
	}
	// Holes stay holes: the destination has exactly the source's pages.
	if dstArea.rss != srcArea.rss || dstArea.anonymous != srcArea.anonymous || srcArea.rss >= size/kib {
		return fmt.Errorf("rss: source %d kB, destination %d kB, region %d kB: holes not preserved", srcArea.rss, dstArea.rss, size/kib)
	}
	if err := expectPattern(dst, addr, size, seed, holeMod); err != nil {
		return err
	}
	if err := sameMemory(src, dst, addr, size); err != nil {
		return err
	}
	if err := src.cont(); err != nil {
		return err
	}
	return divergeBothWays(src, dst, addr, size, seed, holeMod)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// divergeBothWays writes one page on each side (and a hole on the
// destination) and checks that only the writer sees its write.
func divergeBothWays(src, dst *proc, addr, size, seed, holeMod uint64) error {
	pages := size / pageSize
	var dstPage, srcPage, holePage uint64 = 1, pages - 2, ^uint64(0)
	for dstPage < pages && isHole(seed, uintptr(dstPage), holeMod) {
		dstPage++
	}
	for srcPage > 0 && isHole(seed, uintptr(srcPage), holeMod) {
		srcPage--
	}
	for p := uint64(0); p < pages && holeMod != 0; p++ {
		if isHole(seed, uintptr(p), holeMod) {
			holePage = p
			break
		}
	}
	srcBefore, err := src.areaAt(addr)
	if err != nil {
		return err
	}
	writes := []struct {
		who  *proc
		page uint64
	}{{dst, dstPage}, {src, srcPage}}
	if holePage != ^uint64(0) {
		writes = append(writes, struct {
			who  *proc
			page uint64
		}{dst, holePage})
	}
	for i, w := range writes {
		if _, err := w.who.do("write %d %d", addr+w.page*pageSize+8, 0xD1CE0000+i); err != nil {
			return err
		}
	}
	for i, w := range writes {
		other := src
		if w.who == src {
			other = dst
		}
		v, err := w.who.doUint("read %d", addr+w.page*pageSize+8)
		if err != nil {
			return err
		}
		if v != uint64(0xD1CE0000+i) {
			return fmt.Errorf("helper %d lost its own write at page %d", w.who.pid, w.page)
		}
		buf := make([]byte, pageSize)
		if err := other.readMem(addr+w.page*pageSize, buf); err != nil {
			return err
		}
		want := make([]byte, pageSize)
		if !isHole(seed, uintptr(w.page), holeMod) {
			for k := uintptr(0); k < wordsPerPage; k++ {
				putUint64(want[k*512:], pattern(seed, uintptr(w.page), k))
			}
		}
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("write by helper %d at page %d leaked into helper %d", w.who.pid, w.page, other.pid)
		}
	}
	srcAfter, err := src.areaAt(addr)
	if err != nil {
		return err
	}
	if srcAfter.rss != srcBefore.rss {
		return fmt.Errorf("source Rss changed from %d to %d kB after the writes", srcBefore.rss, srcAfter.rss)
	}
	// Everything else is still identical on both sides.
	skip := map[uint64]bool{}
	for _, w := range writes {
		skip[w.page] = true
	}
	a, b := make([]byte, pageSize), make([]byte, pageSize)
	for p := uint64(0); p < pages; p += 97 {
		if skip[p] {
			continue
		}
		if err := src.readMem(addr+p*pageSize, a); err != nil {
			return err
		}
		if err := dst.readMem(addr+p*pageSize, b); err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("page %d differs after unrelated writes", p)
		}
	}
	return nil
}

func testSeveralDestinations(s *suite) error {
	const size = 16 * mib
	const seed, holeMod = 0x5e7, 4
	src := mustSpawn()
	defer src.release()
	dsts := []*proc{mustSpawn(), mustSpawn(), mustSpawn()}
	for _, d := range dsts {
		defer d.release()
	}
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, append([]*proc{src}, dsts...)...); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seed, holeMod); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	for _, d := range dsts {
		if _, _, err := s.cherrypick(src, d, addr, size); err != nil {
			return err
		}
	}
	for _, d := range dsts {
		if _, err := checkShared(d, addr, uint64(1+len(dsts))); err != nil {
			return err
		}
	}
	// The source exits (killed while stopped); its pages live on.
	src.kill()
	for _, d := range dsts {
		if err := expectPattern(d, addr, size, seed, holeMod); err != nil {
			return fmt.Errorf("after the source exited: %w", err)
		}
		if _, err := checkShared(d, addr, uint64(len(dsts))); err != nil {
			return fmt.Errorf("after the source exited: %w", err)
		}
	}
	if _, err := dsts[0].do("fill %d %d %d %d", addr, size, seed+1, 0); err != nil {
		return err
	}
	if err := expectPattern(dsts[0], addr, size, seed+1, 0); err != nil {
		return err
	}
	for _, d := range dsts[1:] {
		if err := expectPattern(d, addr, size, seed, holeMod); err != nil {
			return fmt.Errorf("a sibling's rewrite leaked: %w", err)
		}
	}
	return nil
}

func testDestinationForks(s *suite) error {
	const size = 8 * mib
	const seed, holeMod = 0xf0, 3
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, 0, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d %d", addr, size, seed, holeMod); err != nil {
		return err
	}
	want, err := src.doUint("sum %d %d", addr, size)
	if err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return err
	}
	// The child sums what it inherited, then writes its first word.
	child, err := dst.doUint("fork %d %d", addr, size)
	if err != nil {
		return err
	}
	if child != want {
		return fmt.Errorf("forked child of the destination sees checksum %#x, want %#x", child, want)
	}
	if err := expectPattern(dst, addr, size, seed, holeMod); err != nil {
		return fmt.Errorf("the child's write leaked into the destination: %w", err)
	}
	if err := expectPattern(src, addr, size, seed, holeMod); err != nil {
		return fmt.Errorf("the child's write leaked into the source: %w", err)
	}
	return nil
}

func testTHP(s *suite) error {
	const size = 16 * mib
	const seed = 0x7e9
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvHugepage, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d %d 0", addr, size, seed); err != nil {
		return err
	}
	before, err := src.areaAt(addr)
	if err != nil {
		return err
	}
	if before.anonHuge == 0 {
		return fmt.Errorf("the source got no transparent huge pages (AnonHugePages 0 of %d kB)", before.rss)
	}
	if err := src.stop(); err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return err
	}
	after, err := checkShared(src, addr, 2)
	if err != nil {
		return err
	}
	dstArea, err := checkShared(dst, addr, 2)
	if err != nil {
		return err
	}
	if after.anonHuge != before.anonHuge || dstArea.anonHuge != before.anonHuge {
		return fmt.Errorf("AnonHugePages before %d kB, source after %d kB, destination %d kB: huge pages were split", before.anonHuge, after.anonHuge, dstArea.anonHuge)
	}
	fmt.Printf("THP: %d kB of %d kB shared as huge pages\n", dstArea.anonHuge, dstArea.rss)
	if err := src.cont(); err != nil {
		return err
	}
	return divergeBothWays(src, dst, addr, size, seed, 0)
}

// testFilePrivate maps two different files privately. The source copies some
// pages on write; the destination must get exactly those, and read its own
// file everywhere else.
func testFilePrivate(s *suite) error {
	const size = 2 * mib
	pathA, pathB := "/tmp/vcp-file-a", "/tmp/vcp-file-b"
	for path, fill := range map[string]byte{pathA: 0xAA, pathB: 0xBB} {
		if err := os.WriteFile(path, bytes.Repeat([]byte{fill}, size), 0o644); err != nil {
			return err
		}
	}
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if _, err := src.do("map %d %d file rw %s", addr, size, pathA); err != nil {
		return err
	}
	if _, err := dst.do("map %d %d file rw %s", addr, size, pathB); err != nil {
		return err
	}
	pages := uint64(size / pageSize)
	written := 0
	for p := uint64(0); p < pages; p++ {
		at := addr + p*pageSize
		if p%3 == 0 {
			if _, err := src.do("write %d %d", at, 0xC0C0000000+p); err != nil {
				return err
			}
			written++
		} else if _, err := src.do("read %d", at); err != nil {
			return err
		}
	}
	if err := src.stop(); err != nil {
		return err
	}
	res, _, err := s.cherrypick(src, dst, addr, size)
	if err != nil {
		return err
	}
	if res.AnonPages != uint64(written) {
		return fmt.Errorf("shared %d anonymous pages, the source copied %d on write", res.AnonPages, written)
	}
	dstArea, err := dst.areaAt(addr)
	if err != nil {
		return err
	}
	if dstArea.rss != dstArea.anonymous || dstArea.anonymous != uint64(written)*4 {
		return fmt.Errorf("destination Rss %d kB, Anonymous %d kB; want only the %d copied pages mapped", dstArea.rss, dstArea.anonymous, written)
	}
	buf := make([]byte, pageSize)
	for p := uint64(0); p < pages; p++ {
		if err := dst.readMem(addr+p*pageSize, buf); err != nil {
			return err
		}
		want := bytes.Repeat([]byte{0xBB}, pageSize)
		if p%3 == 0 {
			want = bytes.Repeat([]byte{0xAA}, pageSize)
			putUint64(want, 0xC0C0000000+p)
		}
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("destination page %d: got %x (first 16 bytes), want %x", p, buf[:16], want[:16])
		}
	}
	return nil
}

func testBenchmark1G(s *suite) error {
	const size = 1 * gib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	res, took, forkNs, err := s.timedCherrypick(src, dst, addr, size, 0x1, 0)
	if err != nil {
		return err
	}
	if res.AnonPages != size/pageSize {
		return fmt.Errorf("shared %d pages, want %d", res.AnonPages, size/pageSize)
	}
	if _, err := checkShared(dst, addr, 2); err != nil {
		return err
	}
	fmt.Printf("TIMING 1GiB cherrypick=%.1fms fork=%.1fms (4 KiB pages)\n", ms(took), float64(forkNs)/1e6)
	// Spot-check content; the 256 MiB test compares every byte.
	buf := make([]byte, pageSize)
	for p := uint64(0); p < size/pageSize; p += 4093 {
		if err := dst.readMem(addr+p*pageSize, buf); err != nil {
			return err
		}
		for w := uintptr(0); w < wordsPerPage; w++ {
			got := uint64(0)
			for i := 0; i < 8; i++ {
				got |= uint64(buf[int(w)*512+i]) << (8 * i)
			}
			if got != pattern(0x1, uintptr(p), w) {
				return fmt.Errorf("page %d word %d differs", p, w)
			}
		}
	}
	return nil
}

// expectErr runs one cherrypick that must be refused with want.
func expectErr(s *suite, what string, want error, srcFd, dstFd int, addr, size uint64) error {
	_, err := s.dev.Cherrypick(srcFd, dstFd, addr, size)
	if !errors.Is(err, want) {
		return fmt.Errorf("%s: got %v, want %v", what, err, want)
	}
	return nil
}
