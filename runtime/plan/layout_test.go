package plan

import "testing"

// The environment moves the branches and the keys, nothing else.
func TestHostLayout(t *testing.T) {
	t.Setenv(EnvBranches, "")
	t.Setenv(EnvKeys, "")
	t.Setenv(EnvTrustedKeys, "")
	if HostLayout() != DefaultLayout() {
		t.Fatalf("without the environment: %+v, want %+v", HostLayout(), DefaultLayout())
	}
	t.Setenv(EnvBranches, "/b")
	t.Setenv(EnvKeys, "/k")
	t.Setenv(EnvTrustedKeys, "/t")
	want := DefaultLayout()
	want.Branches, want.Keys, want.TrustedKeys = "/b", "/k", "/t"
	if got := HostLayout(); got != want {
		t.Fatalf("moved: %+v, want %+v", got, want)
	}
	if s := DefaultLayout().ServiceSocket(); s != "/run/tclone/tclone.sock" {
		t.Errorf("service socket %s", s)
	}
}
