package fork

import (
	"fmt"
	"os"

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
	self, err := procfs.ReadStatus(os.Getpid())
	if err != nil {
		return err
	}
	if hasCapability(self, unix.CAP_SYS_RESOURCE) {
		return nil
	}
	for _, pid := range procfs.Tree(root) {
		st, err := procfs.ReadStatus(pid)
		if err != nil {
			continue // gone meanwhile
		}
		if foreignTo(st, os.Getuid(), os.Getgid()) {
			return fmt.Errorf("cannot capture the container: its process %d (%s) runs as user %d, group %d, and CRIU can read "+
				"the resource limits of another user's process only with CAP_SYS_RESOURCE, which this host withholds from root "+
				"(it is not in the capability bounding set). Run the container's processes as root (podman run --user 0), "+
				"or fork on a host whose root has CAP_SYS_RESOURCE; a --files-only fork does not need it",
				pid, st.Name, st.Uid[1], st.Gid[1])
		}
	}
	return nil
}

// foreignTo tells whether the kernel counts the process as another user's
// for prlimit: any of its real, effective or saved user or group IDs
// differs from the caller's real ones.
func foreignTo(st procfs.Status, uid, gid int) bool {
	for i := range 3 {
		if st.Uid[i] != uid || st.Gid[i] != gid {
			return true
		}
	}
	return false
}

// hasCapability tells whether a process's effective capabilities hold c.
func hasCapability(st procfs.Status, c int) bool {
	return st.CapEff&(1<<uint(c)) != 0
}
