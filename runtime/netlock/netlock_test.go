package netlock

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/test/testenv"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "network namespaces, TCP repair mode")
}

// scratchNamespace starts a process in a network namespace of its own and
// returns that namespace.
func scratchNamespace(t *testing.T) Namespace {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "sleep", "600")
	if err := cmd.Start(); err != nil {
		testenv.Missing(t, "unshare: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	path := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	self, _ := Identify("/proc/self/ns/net")
	for i := 0; i < 100; i++ {
		ns, err := Identify(path)
		if err == nil && ns.Inode != self.Inode {
			return ns
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the scratch process never entered its own network namespace")
	return Namespace{}
}

// criuLock is the lock CRIU 4.2's iptables_network_lock_internal loads.
const criuLock = "*filter\n:CRIU - [0:0]\n-I INPUT -j CRIU\n-I OUTPUT -j CRIU\n" +
	"-A CRIU -m mark --mark 0xC114 -j ACCEPT\n-A CRIU -j DROP\nCOMMIT\n"

// A lock CRIU left in a namespace is found and removed, and only there.
func TestRemoveLockLeftByCRIU(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		testenv.Missing(t, "iptables-restore not installed")
	}
	ns := scratchNamespace(t)
	err := inNamespace(ns, func() error {
		cmd := exec.Command("iptables-restore", "-w", "--noflush")
		cmd.Stdin = strings.NewReader(criuLock)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if err != nil {
		testenv.Missing(t, "cannot load an iptables lock here: %v", err)
	}
	found, err := RemoveLock(ns)
	if err != nil || !found {
		t.Fatalf("RemoveLock: found %v, %v", found, err)
	}
	inNamespace(ns, func() error {
		if out, _ := exec.Command("iptables-save").Output(); strings.Contains(string(out), "CRIU") {
			t.Errorf("the lock is still there:\n%s", out)
		}
		return nil
	})
	if found, err := RemoveLock(ns); found || err != nil {
		t.Fatalf("a second removal found %v, %v", found, err)
	}
}

// A namespace that is gone, or a path that now names another namespace, is
// left alone.
func TestRemoveLockIgnoresOtherNamespaces(t *testing.T) {
	if found, err := RemoveLock(Namespace{Path: "/nonexistent/ns", Inode: 1}); found || err != nil {
		t.Fatalf("missing namespace: %v, %v", found, err)
	}
	self, err := Identify("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := inNamespace(Namespace{Path: self.Path, Inode: self.Inode + 1}, func() error { ran = true; return nil }); err != nil || ran {
		t.Fatalf("ran in a namespace whose inode changed: %v, %v", ran, err)
	}
}

// A socket a dead CRIU left in repair mode is taken out of it, and the
// connection carries data again.
func TestEndTCPRepair(t *testing.T) {
	requireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	raw, _ := client.(*net.TCPConn).SyscallConn()
	var serr error
	raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1) })
	if serr != nil {
		testenv.Missing(t, "cannot enter TCP repair mode: %v", serr)
	}
	n, err := EndTCPRepair([]int{os.Getpid()})
	if err != nil || n != 1 {
		t.Fatalf("EndTCPRepair: %d sockets, %v", n, err)
	}
	var on int
	raw.Control(func(fd uintptr) { on, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR) })
	if serr != nil || on != 0 {
		t.Fatalf("repair mode after EndTCPRepair: %d, %v", on, serr)
	}
	client.Write([]byte("x"))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil {
		t.Fatalf("the connection carries nothing after repair mode: %v", err)
	}
	if n, _ := EndTCPRepair([]int{os.Getpid()}); n != 0 {
		t.Fatalf("a second pass found %d sockets in repair mode", n)
	}
}
