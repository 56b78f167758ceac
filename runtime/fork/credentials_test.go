package fork

import (
	"testing"

	"golang.org/x/sys/unix"
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
		p := parseProcessIDs(status(c.uid, c.gid))
		if p.name != "postgres" || p.foreignTo(0, 0) != c.foreign {
			t.Errorf("uid %q gid %q: %+v foreign=%v, want %v", c.uid, c.gid, p, p.foreignTo(0, 0), c.foreign)
		}
	}
}

func TestHasCapability(t *testing.T) {
	// This host's root: everything but CAP_SYS_RESOURCE (24).
	s := "CapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n"
	if hasCapability(s, unix.CAP_SYS_RESOURCE) || !hasCapability(s, unix.CAP_SYS_ADMIN) {
		t.Errorf("CapEff misread")
	}
	if hasCapability("Name:\tx\n", unix.CAP_SYS_ADMIN) {
		t.Errorf("no CapEff line read as a capability")
	}
}
