package fork

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// checkDumpableCredentials refuses, before the source is touched, a tree
// CRIU cannot dump from this process. CRIU reads every process's resource
// limits with prlimit(2), which the kernel allows on a process of another
// user (any of its real, effective or saved user or group IDs other than
// the caller's) only with CAP_SYS_RESOURCE. Root without it (a host whose
// bounding set withholds it) can dump only trees that run as root; CRIU
// would fail mid-dump with "Can't get rlimit 0: Operation not permitted".
func checkDumpableCredentials(root int) error {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	if hasCapability(string(status), unix.CAP_SYS_RESOURCE) {
		return nil
	}
	for _, pid := range procfs.Tree(root) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // gone meanwhile
		}
		ids := parseProcessIDs(string(data))
		if ids.foreignTo(os.Getuid(), os.Getgid()) {
			return fmt.Errorf("cannot capture the container: its process %d (%s) runs as user %d, group %d, and CRIU can read "+
				"the resource limits of another user's process only with CAP_SYS_RESOURCE, which this host withholds from root "+
				"(it is not in the capability bounding set). Run the container's processes as root (podman run --user 0), "+
				"or fork on a host whose root has CAP_SYS_RESOURCE; a --files-only fork does not need it",
				pid, ids.name, ids.uid[1], ids.gid[1])
		}
	}
	return nil
}

// processIDs are a process's real, effective and saved user and group IDs.
type processIDs struct {
	name     string
	uid, gid [3]int
}

// foreignTo tells whether the kernel counts the process as another user's
// for prlimit: any of its IDs differs from the caller's real ones.
func (p processIDs) foreignTo(uid, gid int) bool {
	for i := range 3 {
		if p.uid[i] != uid || p.gid[i] != gid {
			return true
		}
	}
	return false
}

// parseProcessIDs reads Name, Uid and Gid from /proc/PID/status.
func parseProcessIDs(status string) processIDs {
	var p processIDs
	for _, line := range strings.Split(status, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		switch key {
		case "Name":
			p.name = strings.TrimSpace(val)
		case "Uid", "Gid":
			ids := &p.uid
			if key == "Gid" {
				ids = &p.gid
			}
			for i := 0; i < 3 && i < len(f); i++ {
				ids[i], _ = strconv.Atoi(f[i])
			}
		}
	}
	return p
}

// hasCapability tells whether CapEff in a /proc status holds capability c.
func hasCapability(status string, c int) bool {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<uint(c)) != 0
		}
	}
	return false
}
