package lazypages

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/test/inheritfd"
)

// The guard tests run a daemon stand-in (this test binary, re-executed) that
// starts a guard, arms it as the daemon would, says "ready", and waits to be
// killed. Victims are children of the test itself, so the test reaps them and
// sees how they died.

const helperEnv = "LAZYPAGES_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "owner":
		ownerHelper(os.Args[len(os.Args)-1])
	case "sender":
		senderHelper(os.Args[len(os.Args)-1])
	case "late-sender":
		lateSenderHelper(os.Args[len(os.Args)-1])
	}
	inheritfd.CloseOnExec()
	code := m.Run()
	if helpersDir != "" {
		os.RemoveAll(helpersDir) // built by the CRIU tests
	}
	os.Exit(code)
}

// ownerHelper runs the steps in plan, comma separated:
//
//	arm:PID      arm a pidfd of PID
//	disarm:PID   arm, then disarm, a pidfd of PID
//	conn:PATH    listen at PATH, accept one restore, arm it, read nothing
//	listen:PATH  listen at PATH and arm the listener; accept nothing
//
// then prints "ready GUARDPID" and sleeps.
func ownerHelper(plan string) {
	g, err := startGuard(func(err error) { fmt.Println("lost", err) })
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for _, step := range strings.Split(plan, ",") {
		verb, arg, _ := strings.Cut(step, ":")
		if err := ownerStep(g, verb, arg); err != nil {
			fmt.Println("error", step, err)
			os.Exit(1)
		}
	}
	g.mu.Lock()
	fmt.Println("ready", g.proc.pid)
	g.mu.Unlock()
	for {
		// Report a replaced guard, so the test can follow it.
		g.mu.Lock()
		pid := g.proc.pid
		g.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		g.mu.Lock()
		if g.proc.pid != pid {
			fmt.Println("guard", g.proc.pid)
		}
		g.mu.Unlock()
	}
}

// keep holds the helper's sockets: a collected net.UnixConn closes its
// descriptor.
var keep []any

func ownerStep(g *guard, verb, arg string) error {
	switch verb {
	case "arm", "disarm":
		pid, _ := strconv.Atoi(arg)
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return err
		}
		if err := g.arm(guardArmTask, fd); err != nil || verb == "arm" {
			return err
		}
		return g.disarm(guardDisarmTask, fd)
	case "conn", "listen":
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: arg, Net: "unix"})
		if err != nil {
			return err
		}
		fd, _ := socketFD(l)
		if verb == "listen" {
			keep = append(keep, l)
			return g.arm(guardArmListener, fd)
		}
		// On the listener, as the daemon does: an accepted socket has it
		// from the start, so a message sent right after the accept names
		// its sender too.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
			return err
		}
		fmt.Println("listening")
		c, err := l.AcceptUnix()
		if err != nil {
			return err
		}
		cfd, _ := socketFD(c)
		keep = append(keep, l, c)
		return g.arm(guardArmConn, cfd)
	}
	return fmt.Errorf("unknown step %q", verb)
}

// senderHelper connects to path, sends a task header as a restored task
// would, and waits.
func senderHelper(path string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Exit(3)
	}
	var hdr [4]byte
	binary.NativeEndian.PutUint32(hdr[:], 1)
	c.Write(hdr[:])
	fmt.Println("sent")
	select {}
}

// lateSenderHelper connects to path, says so, and sends a task header only
// once a line arrives on its stdin: a restored task that sends after the
// daemon died.
func lateSenderHelper(path string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Exit(3)
	}
	fmt.Println("connected")
	bufio.NewReader(os.Stdin).ReadString('\n')
	var hdr [4]byte
	binary.NativeEndian.PutUint32(hdr[:], 1)
	c.Write(hdr[:])
	fmt.Println("sent")
	select {}
}

type victim struct {
	cmd  *exec.Cmd
	done chan error
}

func startVictim(t *testing.T, mode, arg string) *victim {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", arg)
	if mode == "" {
		cmd = exec.Command("sleep", "60")
	} else {
		cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	}
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v := &victim{cmd: cmd, done: make(chan error, 1)}
	if mode == "sender" {
		if line, _ := bufio.NewReader(out).ReadString('\n'); line != "sent\n" {
			t.Fatalf("sender said %q", line)
		}
	}
	go func() { v.done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return v
}

// killedWithin reports whether the victim died of SIGKILL within d.
func (v *victim) killedWithin(d time.Duration) bool {
	select {
	case <-v.done:
		ws := v.cmd.ProcessState.Sys().(syscall.WaitStatus)
		return ws.Signaled() && ws.Signal() == syscall.SIGKILL
	case <-time.After(d):
		return false
	}
}

type owner struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	guard int
}

func startOwner(t *testing.T, plan string, wait ...string) *owner {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", plan)
	cmd.Env = append(os.Environ(), helperEnv+"=owner")
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	o := &owner{cmd: cmd, lines: bufio.NewScanner(out)}
	for _, w := range wait {
		o.expect(t, w)
	}
	f := strings.Fields(o.expect(t, "ready"))
	o.guard, _ = strconv.Atoi(f[1])
	return o
}

func (o *owner) expect(t *testing.T, prefix string) string {
	t.Helper()
	if !o.lines.Scan() {
		t.Fatalf("owner exited before saying %q", prefix)
	}
	if l := o.lines.Text(); strings.HasPrefix(l, prefix) {
		return l
	} else {
		t.Fatalf("owner said %q, want %q", l, prefix)
	}
	return ""
}

func (o *owner) kill(t *testing.T) {
	t.Helper()
	o.cmd.Process.Signal(syscall.SIGKILL)
	o.cmd.Wait()
}

func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] == "Z"
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if gone(pid) {
			return
		}
	}
	t.Fatalf("%s (pid %d) still there 15 s after the owner died", what, pid)
}

func TestGuardKillsArmedTasksWhenTheOwnerIsKilled(t *testing.T) {
	armed, disarmed := startVictim(t, "", ""), startVictim(t, "", "")
	o := startOwner(t, fmt.Sprintf("arm:%d,disarm:%d", armed.cmd.Process.Pid, disarmed.cmd.Process.Pid))
	if armed.killedWithin(200 * time.Millisecond) {
		t.Fatal("armed task killed while its owner was alive")
	}
	o.kill(t)
	if !armed.killedWithin(10 * time.Second) {
		t.Fatal("armed task survived the owner's SIGKILL")
	}
	waitGone(t, o.guard, "guard")
	if disarmed.killedWithin(100 * time.Millisecond) {
		t.Fatal("disarmed task was killed")
	}
}

// startConnOwner starts an owner that accepts one restore at path, and
// waits until it listens; it says "ready" once it accepted.
func startConnOwner(t *testing.T, path string) *owner {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "conn:"+path)
	cmd.Env = append(os.Environ(), helperEnv+"=owner")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	o := &owner{cmd: cmd, lines: bufio.NewScanner(out)}
	o.expect(t, "listening")
	return o
}

// TestGuardKillsSendersOfUnreadMessages: a restore whose task sent its
// header, and the daemon never read it: only the guard can tell who sent it.
func TestGuardKillsSendersOfUnreadMessages(t *testing.T) {
	path := t.TempDir() + "/lazy.sock"
	o := startConnOwner(t, path)
	sender := startVictim(t, "sender", path)
	f := strings.Fields(o.expect(t, "ready"))
	o.guard, _ = strconv.Atoi(f[1])
	o.kill(t)
	if !sender.killedWithin(10 * time.Second) {
		t.Fatal("the sender of an unread message survived the owner's SIGKILL")
	}
	waitGone(t, o.guard, "guard")
}

// TestGuardKillsLateSenders: a restore the daemon accepted, whose task sends
// only after the daemon died. The guard goes on reading the connection until
// the restore closes it, so that sender is killed too, not left with a
// userfaultfd nobody will fill.
func TestGuardKillsLateSenders(t *testing.T) {
	path := t.TempDir() + "/lazy.sock"
	o := startConnOwner(t, path)

	late := exec.Command(os.Args[0], "-test.run=^$", path)
	late.Env = append(os.Environ(), helperEnv+"=late-sender")
	release, _ := late.StdinPipe()
	lateOut, _ := late.StdoutPipe()
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	v := &victim{cmd: late, done: make(chan error, 1)}
	lines := bufio.NewReader(lateOut)
	if line, _ := lines.ReadString('\n'); line != "connected\n" {
		t.Fatalf("late sender said %q", line)
	}
	go func() { v.done <- late.Wait() }()
	t.Cleanup(func() { late.Process.Kill() })
	f := strings.Fields(o.expect(t, "ready"))
	o.guard, _ = strconv.Atoi(f[1])

	o.kill(t)
	// The guard has drained what there was; the connection stays open.
	if v.killedWithin(300 * time.Millisecond) {
		t.Fatal("a connected restore's process was killed before it sent anything")
	}
	// It may be killed before it can say it sent.
	fmt.Fprintln(release)
	if !v.killedWithin(10 * time.Second) {
		t.Fatal("a task that sent after the daemon died survived")
	}
	waitGone(t, o.guard, "guard")
}

// TestGuardKillsSendersOfUnacceptedRestores: a restore connected and sent,
// and the daemon never accepted it.
func TestGuardKillsSendersOfUnacceptedRestores(t *testing.T) {
	path := t.TempDir() + "/lazy.sock"
	o := startOwner(t, "listen:"+path)
	sender := startVictim(t, "sender", path)
	o.kill(t)
	if !sender.killedWithin(10 * time.Second) {
		t.Fatal("the sender of an unaccepted restore survived the owner's SIGKILL")
	}
	waitGone(t, o.guard, "guard")
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("the dead daemon's socket still accepts restores")
	}
}

// TestGuardIsReplacedWhenItDies: a killed guard is replaced and armed again,
// so the owner's death is still covered.
func TestGuardIsReplacedWhenItDies(t *testing.T) {
	armed := startVictim(t, "", "")
	o := startOwner(t, fmt.Sprintf("arm:%d", armed.cmd.Process.Pid))
	syscall.Kill(o.guard, syscall.SIGKILL)
	f := strings.Fields(o.expect(t, "guard"))
	next, _ := strconv.Atoi(f[1])
	if armed.killedWithin(100 * time.Millisecond) {
		t.Fatal("the guard's own death killed the armed task")
	}
	o.kill(t)
	if !armed.killedWithin(10 * time.Second) {
		t.Fatal("armed task survived the owner's SIGKILL after the guard was replaced")
	}
	waitGone(t, next, "replacement guard")
}

// TestGuardExitsWithItsOwner: a daemon that exits with nothing armed takes
// its guard along, and the guard kills nothing.
func TestGuardExitsWithItsOwner(t *testing.T) {
	bystander := startVictim(t, "", "")
	o := startOwner(t, fmt.Sprintf("disarm:%d", bystander.cmd.Process.Pid))
	o.kill(t)
	waitGone(t, o.guard, "guard")
	if bystander.killedWithin(100 * time.Millisecond) {
		t.Fatal("a disarmed task was killed")
	}
}
