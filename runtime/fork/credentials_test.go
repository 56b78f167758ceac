package fork

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

func TestProcessIDsForeignToRoot(t *testing.T) {
	status := func(uid, gid string) string {
		return "Name:\tpostgres\nUmask:\t0077\nUid:\t" + uid + "\nGid:\t" + gid + "\nCapEff:\t000001fffeffffff\n"
	}
	for _, c := range []struct {
		uid, gid string
		foreign  bool
	}{
		{"0\t0\t0\t0", "0\t0\t0\t0", false},
		{"100\t100\t100\t100", "102\t102\t102\t102", true},
		{"0\t100\t0\t100", "0\t0\t0\t0", true}, // a set-uid effective user
		{"0\t0\t100\t0", "0\t0\t0\t0", true},   // a saved one
		{"0\t0\t0\t0", "0\t5\t0\t5", true},     // a group
	} {
		p, err := procfs.ParseStatus(status(c.uid, c.gid))
		if err != nil || p.Name != "postgres" || foreignTo(p, 0, 0) != c.foreign {
			t.Errorf("uid %q gid %q: %+v (%v) foreign=%v, want %v", c.uid, c.gid, p, err, foreignTo(p, 0, 0), c.foreign)
		}
	}
}

func TestHasCapability(t *testing.T) {
	// This host's root: everything but CAP_SYS_RESOURCE (24).
	s, err := procfs.ParseStatus("CapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n")
	if err != nil || hasCapability(s, unix.CAP_SYS_RESOURCE) || !hasCapability(s, unix.CAP_SYS_ADMIN) {
		t.Errorf("CapEff misread: %+v, %v", s, err)
	}
	if s, _ := procfs.ParseStatus("Name:\tx\n"); hasCapability(s, unix.CAP_SYS_ADMIN) {
		t.Errorf("no CapEff line read as a capability")
	}
}
