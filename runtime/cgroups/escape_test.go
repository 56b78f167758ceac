package cgroups

import "testing"

// Keepers move only in hierarchies through which a group is killed or
// frozen, never in one holding the memory controller.
func TestKeeperMount(t *testing.T) {
	for _, c := range []struct {
		fstype, opts string
		want         bool
	}{
		{"cgroup2", "rw,nosuid,nodev,noexec,relatime", true},
		{"cgroup", "rw,relatime,freezer", true},
		{"cgroup", "rw,relatime,pids", true},
		{"cgroup", "rw,nosuid,xattr,name=systemd", true},
		{"cgroup", "rw,relatime,memory", false},
		{"cgroup", "rw,relatime,memory,pids", false},
		{"cgroup", "rw,relatime,cpu,cpuacct", false},
		{"cgroup", "rw,relatime,devices", false},
		{"tmpfs", "rw,freezer", false},
	} {
		if got := keeperMount(c.fstype, c.opts); got != c.want {
			t.Errorf("keeperMount(%q, %q) = %v, want %v", c.fstype, c.opts, got, c.want)
		}
	}
}
