package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
	"golang.org/x/sys/unix"
)

func isErr(err, target error) bool { return errors.Is(err, target) }

func mountFS(source, target, fstype string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(source, target, fstype, 0, ""); err != nil && err != unix.EBUSY {
		return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
	}
	return nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// writeFile writes a control file (sysfs, procfs, cgroupfs) with plain
// system calls. os.WriteFile would register a pollable kernfs file with Go's
// poller, and then wait forever on an EAGAIN, which memory.reclaim returns
// when it reclaimed less than asked.
func writeFile(path, value string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() (bool, error)) error {
	timeout = slow(timeout)
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procState is the one-letter state of a process (R, S, T, Z...).
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	return b[i+2], nil
}

// testUserNamespace: root inside a user namespace (uid 0 mapped to 0, so it
// can even open the 0600 node) is still not privileged in the initial
// namespace, and is refused.
func testUserNamespace(s *suite) error {
	const size = 2 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, 0, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 3 0", addr, size); err != nil {
		return err
	}
	for _, p := range []*proc{src, dst} {
		if err := p.stop(); err != nil {
			return err
		}
	}
	caller, err := spawnWith(0, 0, func(a *syscall.SysProcAttr) {
		a.Cloneflags = unix.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
	})
	if err != nil {
		return err
	}
	defer caller.release()
	_, err = caller.do("cherrypick %d %d %d %d", src.pid, dst.pid, addr, size)
	if err == nil || !strings.Contains(err.Error(), "errno EPERM") {
		return fmt.Errorf("root in a user namespace: got %v, want EPERM", err)
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "root in a user namespace", "EPERM")
	// The same call from the initial namespace works.
	if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, addr, size); err != nil {
		return err
	}
	return expectPattern(dst, addr, size, 3, 0)
}

// uprobeOffset is the file offset of a function of this binary.
func uprobeOffset(path, symbol string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return 0, err
	}
	for _, sym := range syms {
		if sym.Name != symbol {
			continue
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_LOAD && sym.Value >= prog.Vaddr && sym.Value < prog.Vaddr+prog.Filesz {
				return sym.Value - prog.Vaddr + prog.Off, nil
			}
		}
	}
	return 0, fmt.Errorf("%s has no symbol %s in a loaded segment", path, symbol)
}

// testUprobes: a source with uprobes has breakpoints in its CoW'd text
// pages; sharing them would plant traps in a destination with no uprobe
// state. Refused with EOPNOTSUPP.
func testUprobes(s *suite) error {
	const tracing = "/sys/kernel/tracing"
	if err := mountFS("tracefs", tracing, "tracefs"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	off, err := uprobeOffset(self, "main.testUprobes") // never run by helpers
	if err != nil {
		return err
	}
	if err := writeFile(tracing+"/uprobe_events", fmt.Sprintf("p:vcp/sum %s:%#x\n", self, off)); err != nil {
		return err
	}
	defer writeFile(tracing+"/uprobe_events", "-:vcp/sum\n")
	if err := writeFile(tracing+"/events/vcp/sum/enable", "1"); err != nil {
		return err
	}
	src, dst := mustSpawn(), mustSpawn() // both carry the breakpoint now
	defer src.release()
	defer dst.release()
	writeFile(tracing+"/events/vcp/sum/enable", "0")
	const size = 2 * mib
	addr := s.region(size)
	if err := mapBoth(addr, size, 0, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 4 0", addr, size); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	_, _, err = s.cherrypick(src, dst, addr, size)
	if !isErr(err, cherrypick.ErrUnsupportedArea) {
		return fmt.Errorf("source with uprobes: got %v, want EOPNOTSUPP", err)
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "source with uprobes", "EOPNOTSUPP")
	return nil
}

// ksmCounter reads a KSM counter of a process (/proc/PID/ksm_stat).
func ksmCounter(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/ksm_stat", key, pid)
}

const ksmSys = "/sys/kernel/mm/ksm/"

// testKSM: KSM-merged pages (one page for many identical ones) and KSM's
// zero pages are shared like any other; the zero pages are counted per
// process and globally, and the destination's unmapping must not drive
// either counter below what is really mapped.
func testKSM(s *suite) error {
	const half = 4 * mib
	const madvMergeable = 12
	globalBefore, err := readInt(ksmSys + "ksm_zero_pages")
	if err != nil {
		return err
	}
	for file, v := range map[string]string{"use_zero_pages": "1", "pages_to_scan": "5000", "sleep_millisecs": "10"} {
		if err := writeFile(ksmSys+file, v); err != nil {
			return err
		}
	}
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr, huge := s.region(2*half), s.region(2*half)
	if err := mapBoth(addr, 2*half, madvNoHugepage, src, dst); err != nil {
		return err
	}
	if err := mapBoth(huge, 2*half, madvHugepage, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 15 0", huge, 2*half); err != nil {
		return err
	}
	const same = 0x5A5A5A5A5A5A5A5A
	if _, err := src.do("fillsame %d %d 0", addr, half); err != nil {
		return err
	}
	if _, err := src.do("fillsame %d %d %d", addr+half, half, uint64(same)); err != nil {
		return err
	}
	if _, err := src.do("madvise %d %d %d", addr, 2*half, madvMergeable); err != nil {
		return err
	}
	if err := writeFile(ksmSys+"run", "1"); err != nil {
		return err
	}
	zeroPages := int64(half / pageSize)
	err = waitFor(90*time.Second, func() (bool, error) {
		z, err := ksmCounter(src.pid, "ksm_zero_pages")
		if err != nil {
			return false, err
		}
		m, err := ksmCounter(src.pid, "ksm_merging_pages")
		return z >= zeroPages && m >= zeroPages-1, err
	})
	writeFile(ksmSys+"run", "0")
	if err != nil {
		return fmt.Errorf("KSM did not merge the source's pages: %w", err)
	}
	if err := src.stop(); err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, 2*half); err != nil {
		return err
	}
	got, err := ksmCounter(dst.pid, "ksm_zero_pages")
	if err != nil {
		return err
	}
	global, _ := readInt(ksmSys + "ksm_zero_pages")
	fmt.Printf("  KSM zero pages: destination %d, system %d (was %d)\n", got, global, globalBefore)
	if got != zeroPages || global != globalBefore+2*zeroPages {
		return fmt.Errorf("destination counts %d KSM zero pages and the system %d; want %d and %d", got, global, zeroPages, globalBefore+2*zeroPages)
	}
	// Counting them must not cost the destination its huge pages elsewhere.
	if err := hugeStaysHuge(s, src, dst, huge, 2*half); err != nil {
		return err
	}
	if err := ksmDiverge(src, dst, addr, half, same); err != nil {
		return err
	}
	// Both gone: the global counter must be back, not below.
	src.kill()
	dst.kill()
	err = waitFor(5*time.Second, func() (bool, error) {
		g, err := readInt(ksmSys + "ksm_zero_pages")
		return g == globalBefore, err
	})
	if err != nil {
		g, _ := readInt(ksmSys + "ksm_zero_pages")
		return fmt.Errorf("with both processes gone the system counts %d KSM zero pages, want %d", g, globalBefore)
	}
	return nil
}

// hugeStaysHuge shares a THP area of a source that has KSM zero pages: the
// destination must map it with huge pages, as the source does.
func hugeStaysHuge(s *suite, src, dst *proc, addr, size uint64) error {
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return err
	}
	a, err := src.areaAt(addr)
	if err != nil {
		return err
	}
	b, err := dst.areaAt(addr)
	if err != nil {
		return err
	}
	if a.anonHuge == 0 || b.anonHuge != a.anonHuge {
		return fmt.Errorf("huge pages: source %d kB, destination %d kB; want the same, not 0", a.anonHuge, b.anonHuge)
	}
	return nil
}

// ksmDiverge checks the shared KSM content on both sides, then writes a zero
// page and a merged page in the destination and checks that only it sees
// the writes.
func ksmDiverge(src, dst *proc, addr, half, same uint64) error {
	for _, p := range []*proc{src, dst} {
		for _, at := range []uint64{addr, addr + half - 8, addr + half, addr + 2*half - 8} {
			want := uint64(0)
			if at >= addr+half {
				want = same
			}
			if v, err := readWord(p, at); err != nil || v != want {
				return fmt.Errorf("helper %d reads %#x at %#x (%v), want %#x", p.pid, v, at, err, want)
			}
		}
	}
	for _, at := range []uint64{addr + 8*pageSize, addr + half + 8*pageSize} {
		if _, err := dst.do("write %d %d", at, 0xD5D5); err != nil {
			return err
		}
		if v, err := readWord(src, at); err != nil || v == 0xD5D5 {
			return fmt.Errorf("the destination's write at %#x reached the source (%v)", at, err)
		}
		if v, err := readWord(dst, at); err != nil || v != 0xD5D5 {
			return fmt.Errorf("the destination lost its write at %#x (%v)", at, err)
		}
	}
	return nil
}

// testMlocked: twins locked the same way (MLOCK_ONFAULT: a destination
// locked with plain mlock is populated, hence never empty) share, diverge
// and exit cleanly; a locked page's accounting going wrong shows as a bad
// page when it is freed.
func testMlocked(s *suite) error {
	const size = 4 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return err
	}
	for _, p := range []*proc{src, dst} {
		if _, err := p.do("mlock %d %d %d", addr, size, unix.MLOCK_ONFAULT); err != nil {
			return err
		}
	}
	if _, err := src.do("fill %d %d 11 4", addr, size); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return err
	}
	if err := src.cont(); err != nil {
		return err
	}
	if err := expectPattern(dst, addr, size, 11, 4); err != nil {
		return err
	}
	if err := divergeBothWays(src, dst, addr, size, 11, 4); err != nil {
		return err
	}
	// The source goes first: the destination's mapping keeps the pages.
	before := make([]byte, 2*mib)
	if err := dst.readMem(addr+mib, before); err != nil {
		return err
	}
	src.kill()
	after := make([]byte, 2*mib)
	if err := dst.readMem(addr+mib, after); err != nil {
		return err
	}
	if !bytes.Equal(before, after) {
		return fmt.Errorf("the destination's locked pages changed when the source exited")
	}
	return nil
}

// testCloneVMSibling: a process that shares the source's (or the
// destination's) memory without being in its thread group must be parked
// too.
func testCloneVMSibling(s *suite) error {
	const size = 2 * mib
	for _, side := range []string{"source", "destination"} {
		src, dst := mustSpawn(), mustSpawn()
		err := cloneVMCase(s, src, dst, side, size)
		src.release()
		dst.release()
		if err != nil {
			return fmt.Errorf("sibling of the %s: %w", side, err)
		}
	}
	return nil
}

func cloneVMCase(s *suite, src, dst *proc, side string, size uint64) error {
	addr := s.region(size)
	if err := mapBoth(addr, size, 0, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 12 0", addr, size); err != nil {
		return err
	}
	owner := src
	if side == "destination" {
		owner = dst
	}
	out, err := owner.do("clonevm")
	if err != nil {
		return err
	}
	sib, err := strconv.Atoi(out)
	if err != nil {
		return err
	}
	defer unix.Kill(sib, unix.SIGKILL)
	if err := src.stop(); err != nil {
		return err
	}
	if err := dst.stop(); err != nil {
		return err
	}
	if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, addr, size); !isErr(err, cherrypick.ErrNotParked) {
		return fmt.Errorf("with the CLONE_VM sibling running: got %v, want EBUSY", err)
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "CLONE_VM sibling of the "+side+" running", "EBUSY")
	if err := unix.Kill(sib, unix.SIGSTOP); err != nil {
		return err
	}
	err = waitFor(5*time.Second, func() (bool, error) {
		st, err := procState(sib)
		return st == 'T', err
	})
	if err != nil {
		return fmt.Errorf("the sibling %d did not stop: %w", sib, err)
	}
	if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, addr, size); err != nil {
		return fmt.Errorf("with the sibling stopped too: %w", err)
	}
	return expectPattern(dst, addr, size, 12, 0)
}

// testConcurrent: calls in opposite directions between the same two
// processes at the same time (each needs both locks), and two sources
// racing for one destination area (exactly one may win).
func testConcurrent(s *suite) error {
	const size = 256 * kib
	const n = 24
	a, b, c := mustSpawn(), mustSpawn(), mustSpawn()
	defer a.release()
	defer b.release()
	defer c.release()
	var ab, ba [n]uint64
	for i := range ab {
		ab[i], ba[i] = s.region(size), s.region(size)
		if err := mapBoth(ab[i], size, 0, a, b); err != nil {
			return err
		}
		if err := mapBoth(ba[i], size, 0, a, b); err != nil {
			return err
		}
		if _, err := a.do("fill %d %d %d 0", ab[i], size, 100+i); err != nil {
			return err
		}
		if _, err := b.do("fill %d %d %d 0", ba[i], size, 200+i); err != nil {
			return err
		}
	}
	race := s.region(size)
	if err := mapBoth(race, size, 0, a, b, c); err != nil {
		return err
	}
	if _, err := a.do("fill %d %d 31 0", race, size); err != nil {
		return err
	}
	if _, err := b.do("fill %d %d 32 0", race, size); err != nil {
		return err
	}
	for _, p := range []*proc{a, b, c} {
		if err := p.stop(); err != nil {
			return err
		}
	}
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	run := func(src, dst *proc, addrs []uint64) {
		defer wg.Done()
		for _, at := range addrs {
			if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, at, size); err != nil {
				errs <- fmt.Errorf("%d -> %d at %#x: %w", src.pid, dst.pid, at, err)
				return
			}
		}
	}
	wg.Add(2)
	go run(a, b, ab[:])
	go run(b, a, ba[:])
	raced := make([]error, 2)
	wg.Add(2)
	for i, src := range []*proc{a, b} {
		go func() {
			defer wg.Done()
			_, raced[i] = s.dev.Cherrypick(src.pidfd, c.pidfd, race, size)
		}()
	}
	if !waitGroupWithin(&wg, 60*time.Second) {
		return fmt.Errorf("concurrent cherrypicks did not finish within 60 s (deadlock?)")
	}
	close(errs)
	for err := range errs {
		return err
	}
	for i := range ab {
		if err := expectPattern(b, ab[i], size, uint64(100+i), 0); err != nil {
			return err
		}
		if err := expectPattern(a, ba[i], size, uint64(200+i), 0); err != nil {
			return err
		}
	}
	return checkRaceWinner(raced, c, race, size)
}

func checkRaceWinner(raced []error, c *proc, race, size uint64) error {
	winner := -1
	for i, err := range raced {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			return fmt.Errorf("both sources were shared into the same destination area")
		case !isErr(err, cherrypick.ErrNotEmpty):
			return fmt.Errorf("the losing call: %v, want EEXIST", err)
		}
	}
	if winner < 0 {
		return fmt.Errorf("neither racing call succeeded: %v, %v", raced[0], raced[1])
	}
	return expectPattern(c, race, size, uint64(31+winner), 0)
}

func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	d = slow(d)
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// testPinned: pages pinned for DMA (io_uring fixed buffers) are copied into
// the destination, as fork() copies them, not shared: the device may still
// write into them, and that must reach the source only.
func testPinned(s *suite) error {
	const size, pinned = 4 * mib, 1 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 13 0", addr, size); err != nil {
		return err
	}
	if _, err := src.do("pin %d %d", addr, pinned); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	res, _, err := s.cherrypick(src, dst, addr, size)
	if err != nil {
		return err
	}
	if res.AnonPages != size/pageSize {
		return fmt.Errorf("destination got %d pages, want %d", res.AnonPages, size/pageSize)
	}
	if err := expectPattern(dst, addr, size, 13, 0); err != nil {
		return err
	}
	a, err := dst.areaAt(addr)
	if err != nil {
		return err
	}
	// Shared pages count half, copied (pinned) ones fully.
	want := uint64((size-pinned)/2/kib + pinned/kib)
	fmt.Printf("  pinned: destination Pss %d kB, want about %d kB (%d kB copied)\n", a.pss, want, pinned/kib)
	if a.pss+64 < want || a.pss > want+64 {
		return fmt.Errorf("destination Pss %d kB, want about %d kB: pinned pages were not copied", a.pss, want)
	}
	if err := src.cont(); err != nil {
		return err
	}
	return divergeBothWays(src, dst, addr, size, 13, 0)
}

// testFreezer: processes frozen by the cgroup v2 freezer are parked; once
// thawed they are not, at once, although their threads keep their "frozen"
// mark until they next run.
func testFreezer(s *suite) error {
	const size = 2 * mib
	if err := cgroupSetup("vcp-frozen"); err != nil {
		return err
	}
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	first, second := s.region(size), s.region(size)
	for _, a := range []uint64{first, second} {
		if err := mapBoth(a, size, 0, src, dst); err != nil {
			return err
		}
		if _, err := src.do("fill %d %d 21 0", a, size); err != nil {
			return err
		}
	}
	for _, p := range []*proc{src, dst} {
		if err := cgroupMove("vcp-frozen", p.pid); err != nil {
			return err
		}
	}
	if err := setFrozen("vcp-frozen", true); err != nil {
		return err
	}
	if _, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, first, size); err != nil {
		setFrozen("vcp-frozen", false)
		return fmt.Errorf("both frozen by the cgroup freezer: %w", err)
	}
	if err := cgroupWrite("vcp-frozen", "cgroup.freeze", "0"); err != nil {
		return err
	}
	_, err := s.dev.Cherrypick(src.pidfd, dst.pidfd, second, size)
	if !isErr(err, cherrypick.ErrNotParked) {
		return fmt.Errorf("right after the thaw: got %v, want EBUSY", err)
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "right after a cgroup thaw", "EBUSY")
	return expectPattern(dst, first, size, 21, 0)
}

// setFrozen freezes or thaws a cgroup and waits until it is done.
func setFrozen(group string, frozen bool) error {
	want := "0"
	if frozen {
		want = "1"
	}
	if err := cgroupWrite(group, "cgroup.freeze", want); err != nil {
		return err
	}
	return waitFor(10*time.Second, func() (bool, error) {
		b, err := os.ReadFile(cgroupRoot + "/" + group + "/cgroup.events")
		return strings.Contains(string(b), "frozen "+want), err
	})
}
