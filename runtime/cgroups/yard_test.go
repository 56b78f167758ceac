package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

func TestYardLinks(t *testing.T) {
	mounts := []*mountinfo.Info{
		{Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", Root: "/", FSType: "cgroup", VFSOptions: "rw,cpu,cpuacct"},
		{Mountpoint: "/sys/fs/cgroup/cpuset", Root: "/", FSType: "cgroup", VFSOptions: "rw,cpuset,clone_children"},
		// A bind of a hierarchy's inner cgroup is not the hierarchy.
		{Mountpoint: "/inner/memory", Root: "/some/cgroup", FSType: "cgroup", VFSOptions: "rw,memory"},
		{Mountpoint: "/sys/fs/cgroup/memory", Root: "/", FSType: "cgroup", VFSOptions: "rw,memory"},
		{Mountpoint: "/sys/fs/cgroup/systemd", Root: "/", FSType: "cgroup", VFSOptions: "rw,xattr,name=systemd,release_agent=/x"},
		{Mountpoint: "/sys/fs/cgroup/unified", Root: "/", FSType: "cgroup2", VFSOptions: "rw,nsdelegate"},
	}
	cgs := procfs.ParseCgroups("5:cpu,cpuacct:/a\n4:cpuset:/\n3:memory:/a\n2:name=systemd:/a\n0::/a\n")
	got, err := yardLinks(cgs, mounts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"cpu,cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"cpuset":      "/sys/fs/cgroup/cpuset",
		"memory":      "/sys/fs/cgroup/memory",
		"systemd":     "/sys/fs/cgroup/systemd",
		"unified":     "/sys/fs/cgroup/unified",
	}
	if len(got) != len(want) {
		t.Fatalf("links %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("link %q -> %q, want %q", k, got[k], v)
		}
	}

	// A hierarchy mounted only in part, or with other controllers, is no
	// hierarchy of the yard's: the dump does without one, and says which.
	for _, line := range []string{"6:pids:/a", "5:cpu:/a", "7:name=other:/"} {
		_, err := yardLinks(procfs.ParseCgroups(line), mounts)
		if err == nil || !strings.Contains(err.Error(), strings.Split(line, ":")[1]) {
			t.Errorf("%s: error %v, want one naming its hierarchy", line, err)
		}
	}
	// Pure cgroup v2: one hierarchy, mounted at the root.
	got, err = yardLinks(procfs.ParseCgroups("0::/a\n"), []*mountinfo.Info{{Mountpoint: "/sys/fs/cgroup", Root: "/", FSType: "cgroup2"}})
	if err != nil || got["unified"] != "/sys/fs/cgroup" || len(got) != 1 {
		t.Errorf("cgroup v2 alone: %v, %v", got, err)
	}
}

// TestYardHere makes the yard a dump of this process would get on this
// host, and checks that each of its links leads to the root of the
// hierarchy it is named for.
func TestYardHere(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "yard")
	if err := Yard(dir, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	self, err := procfs.SelfCgroups()
	if err != nil {
		t.Fatal(err)
	}
	if len(self) == 0 {
		t.Fatal("no cgroup lines in /proc/self/cgroup")
	}
	for _, cg := range self {
		name, _ := yardName(cg.Controllers)
		link := filepath.Join(dir, name)
		var st unix.Statfs_t
		if err := unix.Statfs(link, &st); err != nil {
			t.Fatalf("%s: %v", link, err)
		}
		if st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Errorf("%s is no cgroup file system (type %#x)", link, st.Type)
		}
		// The root of its hierarchy: the process's own cgroup is there.
		if _, err := os.Stat(filepath.Join(link, cg.Path)); err != nil {
			t.Errorf("%s does not hold this process's cgroup %s: %v", link, cg.Path, err)
		}
	}
}
