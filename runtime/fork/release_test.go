package fork

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/netlock"
	"github.com/tclone/tclone/test/testenv"
)

// A capture whose CRIU died while it held the source's network locked and a
// connection in repair mode: recovery removes the lock and ends the repair
// mode, so the source, which runs again, talks again.
func TestRecoveryFreesTheSourceNetwork(t *testing.T) {
	testenv.NeedRoot(t, "network namespaces, TCP repair mode")
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		testenv.Missing(t, "iptables-restore not installed")
	}
	e := testEngine(t)

	// The source's network namespace, locked the way CRIU 4.2 locks it.
	holder := exec.Command("unshare", "--net", "sh", "-c", `printf '*filter\n:CRIU - [0:0]\n-I INPUT -j CRIU\n-I OUTPUT -j CRIU\n-A CRIU -m mark --mark 0xC114 -j ACCEPT\n-A CRIU -j DROP\nCOMMIT\n' | iptables-restore -w --noflush && echo locked && exec sleep 600`)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf[:6]) != "locked" {
		testenv.Missing(t, "cannot lock a scratch namespace here: %q %v", buf, err)
	}
	ns, err := netlock.Identify(fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}

	// A connection of the source's in repair mode; the source's cgroup
	// lists this process.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, _ := conn.(*net.TCPConn).SyscallConn()
	var serr error
	raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1) })
	if serr != nil {
		testenv.Missing(t, "cannot enter TCP repair mode: %v", serr)
	}
	cgroup := t.TempDir()
	os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)

	orphan(t, e, journal.Record{Kind: journal.Capture, Phase: journal.CaptureSeized, Capture: &journal.CaptureRecord{SourceID: "src", Source: &journal.SourceRefs{NetNS: ns.Path, NetNSInode: ns.Inode, CgroupDir: cgroup, NetworkLocked: true, TCPRepair: true}}})
	if _, err := e.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	rules, err := exec.Command("nsenter", "--net="+ns.Path, "iptables-save").Output()
	if err != nil {
		t.Fatalf("iptables-save in the source's namespace: %v", err)
	}
	if strings.Contains(string(rules), "CRIU") {
		t.Errorf("the network lock is still in place:\n%s", rules)
	}
	var on int
	raw.Control(func(fd uintptr) { on, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR) })
	if serr != nil || on != 0 {
		t.Errorf("the source's connection is still in repair mode: %d %v", on, serr)
	}
	if n := journalEntries(t, e); n != 0 {
		t.Fatalf("%d journal entries left", n)
	}
}

// A capture that never reached CRIU's seizing has nothing to release.
func TestReleaseBeforeSeizingIsANoOp(t *testing.T) {
	e := testEngine(t)
	rec := journal.Record{Kind: journal.Capture, Phase: journal.CaptureDump, Capture: &journal.CaptureRecord{SourceID: "src", Source: &journal.SourceRefs{NetNS: "/proc/self/ns/net", NetworkLocked: true, TCPRepair: true, CgroupDir: "/nonexistent"}}}
	if err := e.releaseSource(rec, true); err != nil {
		t.Fatal(err)
	}
}

// CRIU announces a network lock even when told to take none; only a lock it
// takes is recorded, since recording one makes every capture look for it
// afterwards (seven iptables and nft runs before the sibling's restore).
func TestNetworkLockRecordedOnlyWhenTaken(t *testing.T) {
	e := testEngine(t)
	for _, skipped := range []bool{true, false} {
		entry, err := e.journal().Begin(journal.Record{Kind: journal.Capture, Phase: journal.CaptureSeized,
			Capture: &journal.CaptureRecord{SourceID: "src", Source: &journal.SourceRefs{NetNS: "/proc/self/ns/net"}}})
		if err != nil {
			t.Fatal(err)
		}
		n := &captureNotify{entry: entry, lockSkipped: skipped}
		if err := n.NetworkLock(); err != nil {
			t.Fatal(err)
		}
		if got := entry.Rec.Capture.Source.NetworkLocked; got == skipped {
			t.Errorf("lock skipped %v: recorded as locked %v", skipped, got)
		}
		entry.End()
	}
}

// A CRIU whose tclone died is given time to end on its own, which undoes its
// dump cleanly; only one that does not end by then is killed.
func TestEndProcessGivesGraceThenKills(t *testing.T) {
	start := func(secs string) (*exec.Cmd, journal.Owner) {
		cmd := exec.Command("sleep", secs)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		o, ok := journal.OwnerOf(cmd.Process.Pid)
		if !ok {
			t.Fatalf("no owner record for %d", cmd.Process.Pid)
		}
		return cmd, o
	}
	ends, o := start("0.3")
	if err := endProcess(o, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ends.Wait(); err != nil {
		t.Fatalf("a process that ended by itself within the grace was killed: %v", err)
	}
	stays, o := start("60")
	began := time.Now()
	if err := endProcess(o, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d < 300*time.Millisecond {
		t.Fatalf("killed after %s, before its grace of 300ms", d)
	}
	if err := stays.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("a process past its grace: %v, want killed", err)
	}
}
