package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// rootHasSysResource tells whether this host's root holds CAP_SYS_RESOURCE,
// without which CRIU cannot dump another user's process.
func rootHasSysResource(t *testing.T) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return mask&(1<<24) != 0
		}
	}
	return false
}

// A container whose processes run as another user than root: on a host
// whose root has CAP_SYS_RESOURCE it forks; on one that withholds it (these
// machines) the fork is refused before the source is touched, saying why
// and what to do, and a files-only fork, which needs no CRIU, still works.
func TestForkOfAnotherUsersContainer(t *testing.T) {
	requireStack(t)
	src := name(t, "user")
	podman(t, "run", "-d", "--name", src, "--user", "100:100", busybox, "sh", "-c", "while :; do sleep 1; done")
	r := forkCLI(t, src)
	if rootHasSysResource(t) {
		if r.code != 0 {
			t.Fatalf("fork of a container run as user 100: %s", r.stderr)
		}
		return
	}
	if r.code == 0 || !strings.Contains(r.stderr, "CAP_SYS_RESOURCE") || !strings.Contains(r.stderr, "--user 0") {
		t.Fatalf("fork without CAP_SYS_RESOURCE: exit %d %q, want a refusal naming it", r.code, r.stderr)
	}
	if got := state(t, src); got != "running" {
		t.Errorf("source is %s after the refusal", got)
	}
	if got := siblingsOf(t, src); len(got) != 0 {
		t.Errorf("siblings after the refusal: %v", got)
	}
	requireNoLeftovers(t)
	if r := forkCLI(t, "--files-only", src); r.code != 0 {
		t.Errorf("files-only fork of the same container: %s", r.stderr)
	}
}
