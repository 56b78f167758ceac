// Package testenv decides what a test does when this machine lacks what the
// test needs. `make test` (and every other make target) exports
// TCLONE_REQUIRE=1, so that a missing piece fails the run instead of
// skipping the test: a green run means the paths ran. A developer without
// root can run `go test ./...` by hand, or `make unit-test TCLONE_REQUIRE=0`,
// and then such tests skip, saying what they missed.
//
// The one exception is what the host can never run, such as a kernel module
// on a kernel without module support: those tests run in the kernel VM
// (make kernel-test), and on the host they skip under InVM, which names the
// VM stage that runs them.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Env is the switch's name.
const Env = "TCLONE_REQUIRE"

// Required reports whether a missing piece must fail the test.
func Required() bool { return os.Getenv(Env) == "1" }

// Missing ends the test for want of something the machine should have: a
// failure under TCLONE_REQUIRE=1, a skip otherwise. The message says what
// is missing; Missing adds what to do.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s (%s=1: a test that cannot run fails; hack/setup-host.sh installs what the tests need)", msg, Env)
	}
	t.Skipf("%s (skipped: %s=1 makes this a failure)", msg, Env)
}

// NeedRoot ends the test by Missing unless it runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// InVM skips a test the host cannot run by its nature, naming the stage of
// the kernel VM (kernel/vmtest) whose selection runs it instead. That
// selection fails when it runs no test of a name it lists, so a test that
// skips here cannot silently run nowhere.
func InVM(t testing.TB, stage, why string) {
	t.Helper()
	t.Skipf("%s: runs in the kernel VM's %s stage instead (make kernel-test)", why, stage)
}
