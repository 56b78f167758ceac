package cgroups

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Headroom is how much more a container's cgroup can take before a limit
// of its own or of an ancestor's stops it.
type Headroom struct {
	// MemoryBytes is what memory the cgroup may still be charged;
	// math.MaxUint64 where nothing limits it.
	MemoryBytes uint64
	// Pids is how many more tasks it may hold; math.MaxInt where nothing
	// limits it.
	Pids int
}

// HeadroomOf reads the memory and pids headroom of the cgroup crun
// recorded for a container, on cgroup v2 and on v1 (hybrid) hosts: the
// least, over the cgroup and its ancestors, of limit less usage.
func HeadroomOf(cgroupPath string) (Headroom, error) {
	h := Headroom{MemoryBytes: math.MaxUint64, Pids: math.MaxInt}
	var memDir, pidsDir string
	var memMax, memCur, pidsMax, pidsCur string
	if Unified() {
		memDir, pidsDir = Root, Root
		memMax, memCur, pidsMax, pidsCur = "memory.max", "memory.current", "pids.max", "pids.current"
	} else {
		memDir, pidsDir = filepath.Join(Root, "memory"), filepath.Join(Root, "pids")
		memMax, memCur, pidsMax, pidsCur = "memory.limit_in_bytes", "memory.usage_in_bytes", "pids.max", "pids.current"
	}
	for _, dir := range lineage(memDir, cgroupPath) {
		free, limited, err := free(dir, memMax, memCur)
		if err != nil {
			return h, err
		}
		if limited && free < h.MemoryBytes {
			h.MemoryBytes = free
		}
	}
	for _, dir := range lineage(pidsDir, cgroupPath) {
		free, limited, err := free(dir, pidsMax, pidsCur)
		if err != nil {
			return h, err
		}
		if limited && free < uint64(h.Pids) {
			h.Pids = int(free)
		}
	}
	return h, nil
}

// lineage lists the directories of cgroupPath and of its ancestors under
// root, deepest first; the root cgroup itself has no limits to read.
func lineage(root, cgroupPath string) []string {
	var out []string
	for p := filepath.Clean("/" + cgroupPath); p != "/"; p = filepath.Dir(p) {
		out = append(out, filepath.Join(root, p))
	}
	return out
}

// free reads limit less usage in dir; limited is false where the limit is
// "max" (v2), or the unlimited sentinel v1 shows, or the files are absent
// (the controller is not enabled there).
func free(dir, maxFile, curFile string) (free uint64, limited bool, err error) {
	max, err := readValue(filepath.Join(dir, maxFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	// v1 shows "no limit" as the largest page-aligned signed value.
	if max == math.MaxUint64 || max >= math.MaxInt64-(1<<20) {
		return 0, false, nil
	}
	cur, err := readValue(filepath.Join(dir, curFile))
	if err != nil {
		return 0, false, err
	}
	if cur >= max {
		return 0, true, nil
	}
	return max - cur, true, nil
}

func readValue(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is no number", path, s)
	}
	return v, nil
}
