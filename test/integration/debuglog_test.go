package integration

import (
	"strings"
	"testing"
	"time"
)

// With --debug (or --log-level debug, Podman's spelling) a fork explains
// itself in the log: each phase with its duration, the CRIU options of the
// dump and the crun command line of the restore; a failed one says where it
// failed.
func TestForkDebugLogExplains(t *testing.T) {
	requireStack(t)
	src := newBundle(t, "dbg", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	sib := newBundle(t, "dbgsib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.save(t)

	r := runDetached(t, nil, tcloneBin(), "--debug", "fork", "--bundle", sib.dir, src.id, sib.id)
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"op=capture", "phase=prepare", "phase=criu-options", "criu_opts=", "phase=dump", "source_pause_ms=", "phase=plan",
		"op=materialize", "phase=rootfs", "msg=\"crun restore\"", "argv=", "phase=restore", "phase_ms=",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the debug log lacks %q:\n%s", want, r.stderr)
		}
	}

	// A capture that fails (held longer than its timeout) says so, and
	// where, with --log-level debug too.
	sib2 := newBundle(t, "dbgsib2", false)
	sib2.spec.Process.Args = src.spec.Process.Args
	sib2.save(t)
	r = runDetached(t, nil, tcloneBin(), "--log-level", "debug", "fork", "--capture-timeout", "1ms", "--bundle", sib2.dir, src.id, sib2.id)
	if r.code == 0 {
		t.Fatal("a fork with a 1ms capture timeout succeeded")
	}
	if !strings.Contains(r.stderr, "op=capture") || !strings.Contains(r.stderr, "msg=failed") || !strings.Contains(r.stderr, "criu_opts=") {
		t.Errorf("the failed capture is not explained:\n%s", r.stderr)
	}
	// The source runs on.
	a := src.counter(t)
	time.Sleep(300 * time.Millisecond)
	if b := src.counter(t); b <= a {
		t.Fatalf("source counter stuck at %d", a)
	}
}
