// Package memuse measures what a container's processes cost in memory:
// resident and proportional set sizes, and what the kernel's samepage
// merging shares of them. PSS is what tells forks apart: pages a sibling
// shares with its source (copy-on-write, or merged by KSM) count half to
// each.
package memuse

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/tclone/tclone/runtime/procfs"
)

// Usage sums the memory of a process tree, in KiB (pages for KSM).
type Usage struct {
	Processes int `json:"processes"`
	RssKiB    int `json:"rss_kib"`
	PssKiB    int `json:"pss_kib"`
	// PrivateDirtyKiB is dirty memory no other address space maps (a
	// copy-on-write snapshot counts as one): what a sibling owns alone.
	PrivateDirtyKiB int `json:"private_dirty_kib"`
	// KSMMergingPages are the tree's pages merged by KSM; KSMMergeAny
	// counts its processes marked mergeable as a whole.
	KSMMergingPages int `json:"ksm_merging_pages"`
	KSMMergeAny     int `json:"ksm_merge_any"`
}

// Tree measures pid and its descendants. Processes that exit while they are
// read are left out.
func Tree(pid int) (Usage, error) {
	var u Usage
	for _, p := range procfs.Tree(pid) {
		one, err := Process(p)
		if err != nil {
			if p == pid {
				return u, err
			}
			continue
		}
		u.Processes++
		u.RssKiB += one.RssKiB
		u.PssKiB += one.PssKiB
		u.PrivateDirtyKiB += one.PrivateDirtyKiB
		u.KSMMergingPages += one.KSMMergingPages
		u.KSMMergeAny += one.KSMMergeAny
	}
	return u, nil
}

// Process measures process pid alone.
func Process(pid int) (Usage, error) {
	rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return Usage{}, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	u := Usage{Processes: 1, RssKiB: field(string(rollup), "Rss:"), PssKiB: field(string(rollup), "Pss:"),
		PrivateDirtyKiB: field(string(rollup), "Private_Dirty:")}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", pid)); err == nil {
		u.KSMMergingPages = field(string(stat), "ksm_merging_pages")
		if strings.Contains(string(stat), "ksm_merge_any: yes") {
			u.KSMMergeAny = 1
		}
	}
	return u, nil
}

// field is the number after name on its line of text.
func field(text, name string) int {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}
