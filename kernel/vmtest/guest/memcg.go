package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroupSetup mounts cgroup v2 (once) with the memory controller enabled
// for children, and makes the named child groups.
func cgroupSetup(names ...string) error {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.procs")); err != nil {
		if err := os.MkdirAll(cgroupRoot, 0o755); err != nil {
			return err
		}
		if err := mountFS("cgroup2", cgroupRoot, "cgroup2"); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"), "+memory"); err != nil {
		return fmt.Errorf("enable the memory controller: %w", err)
	}
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(cgroupRoot, n), 0o755); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

func cgroupWrite(group, file, value string) error {
	return writeFile(filepath.Join(cgroupRoot, group, file), value)
}

func cgroupMove(group string, pid int) error {
	return cgroupWrite(group, "cgroup.procs", strconv.Itoa(pid))
}

// memStat reads one memory.stat counter (bytes) of a group.
func memStat(group, key string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, group, "memory.stat"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s's memory.stat", key, group)
}

// kmsg writes a line into the kernel log.
func kmsg(line string) {
	writeFile("/dev/kmsg", line+"\n")
}

// Lines between these two in the kernel log belong to an OOM report the
// suite provokes on purpose; the log check excuses its stack dump (see
// kernel/vmtest/logcheck.awk) and nothing else.
const (
	oomBegin = "vcptest: expected OOM report begins"
	oomEnd   = "vcptest: expected OOM report ends"
)

// testMemcg: the page tables and anon_vma chains a cherrypick allocates
// belong to the destination and are charged to its memory cgroup, not to
// the caller's. A destination whose cgroup cannot take them gets ENOMEM
// with nothing changed, and the same call succeeds once the limit is raised.
func testMemcg(s *suite) error {
	const size = 64 * mib
	const tables = size / thpSize * pageSize // PTE tables for the range
	if err := cgroupSetup("vcp-caller", "vcp-dst", "vcp-tight"); err != nil {
		return err
	}
	self := os.Getpid()
	if err := cgroupMove("vcp-caller", self); err != nil {
		return err
	}
	defer cgroupWrite("", "cgroup.procs", strconv.Itoa(self))
	src, dst, tight := mustSpawn(), mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	defer tight.release()
	addr := s.region(size)
	if err := mapBoth(addr, size, madvNoHugepage, src, dst, tight); err != nil {
		return err
	}
	if _, err := src.do("fill %d %d 77 0", addr, size); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	if err := cgroupMove("vcp-dst", dst.pid); err != nil {
		return err
	}
	if err := charges(s, src, dst, addr, size, tables); err != nil {
		return err
	}
	if err := cgroupMove("vcp-tight", tight.pid); err != nil {
		return err
	}
	return enomemRollback(s, src, tight, addr, size)
}

// charges checks where the page tables of one cherrypick were charged.
func charges(s *suite, src, dst *proc, addr, size, tables uint64) error {
	dstBefore, err := memStat("vcp-dst", "pagetables")
	if err != nil {
		return err
	}
	callerBefore, err := memStat("vcp-caller", "pagetables")
	if err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return err
	}
	// memory.stat is flushed lazily (at most every 2 s).
	var dstAfter, callerAfter uint64
	waitFor(4*time.Second, func() (bool, error) {
		dstAfter, err = memStat("vcp-dst", "pagetables")
		return dstAfter >= dstBefore+tables, err
	})
	if err != nil {
		return err
	}
	if callerAfter, err = memStat("vcp-caller", "pagetables"); err != nil {
		return err
	}
	fmt.Printf("  page tables: destination's cgroup %+d kB, caller's %+d kB (the range needs %d kB)\n",
		(int64(dstAfter)-int64(dstBefore))/kib, (int64(callerAfter)-int64(callerBefore))/kib, tables/kib)
	if dstAfter < dstBefore+tables {
		return fmt.Errorf("the destination's cgroup was charged %d bytes of page tables, want at least %d", dstAfter-dstBefore, tables)
	}
	if callerAfter > callerBefore+tables/4 {
		return fmt.Errorf("the caller's cgroup was charged %d bytes of page tables for the destination", callerAfter-callerBefore)
	}
	return expectPattern(dst, addr, size, 77, 0)
}

// enomemRollback runs the call into a destination whose cgroup has room for
// only a few page tables: it must fail with ENOMEM part-way, leave the
// destination empty, and work once the limit is lifted.
func enomemRollback(s *suite, src, dst *proc, addr, size uint64) error {
	// No OOM victim in that group: the charge fails instead of killing.
	if err := writeFile(fmt.Sprintf("/proc/%d/oom_score_adj", dst.pid), "-1000"); err != nil {
		return err
	}
	cur, err := os.ReadFile(filepath.Join(cgroupRoot, "vcp-tight", "memory.current"))
	if err != nil {
		return err
	}
	used, err := strconv.ParseUint(strings.TrimSpace(string(cur)), 10, 64)
	if err != nil {
		return err
	}
	if err := cgroupWrite("vcp-tight", "memory.max", strconv.FormatUint(used+64*kib, 10)); err != nil {
		return err
	}
	kmsg(oomBegin)
	_, _, err = s.cherrypick(src, dst, addr, size)
	kmsg(oomEnd)
	if err == nil {
		return fmt.Errorf("cherrypick into a cgroup limited to %d kB more than it uses succeeded; its page tables were charged elsewhere", 64)
	}
	if !isErr(err, cherrypick.ErrNoMemory) {
		return fmt.Errorf("cherrypick into a full cgroup: %v, want ENOMEM", err)
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "destination's cgroup full", "ENOMEM")
	if a, err := dst.areaAt(addr); err != nil || a.rss != 0 || a.anonymous != 0 {
		return fmt.Errorf("after ENOMEM the destination keeps Rss %d kB (%v); want it unchanged (empty)", a.rss, err)
	}
	if err := cgroupWrite("vcp-tight", "memory.max", "max"); err != nil {
		return err
	}
	if _, _, err := s.cherrypick(src, dst, addr, size); err != nil {
		return fmt.Errorf("retry after ENOMEM with the limit lifted: %w", err)
	}
	if _, err := checkShared(dst, addr, 3); err != nil {
		return err
	}
	return expectPattern(dst, addr, size, 77, 0)
}
