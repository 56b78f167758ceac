//go:build linux && amd64

package inject

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/test/testenv"
)

// The helper is a parent with a child of exit signal 0 (as a twin's): it
// prints the child's pid, then ticks every 10 ms in a sleep that the
// injected call interrupts, and says when a tick came early or a sleep
// failed.
const helperEnv = "TCLONE_INJECT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		helper()
		return
	}
	os.Exit(m.Run())
}

//go:norace
func helper() {
	// A raw clone with no exit signal: the child only waits, in raw
	// system calls, until it is killed.
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, 0, 0, 0, 0, 0, 0)
	if e != 0 {
		fmt.Println("clone:", e)
		os.Exit(1)
	}
	if r == 0 {
		for {
			syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	}
	fmt.Println(r)
	for {
		ts := unix.Timespec{Nsec: 10 * 1e6}
		before := time.Now()
		if err := unix.Nanosleep(&ts, nil); err != nil {
			fmt.Println("sleep failed:", err)
		}
		if time.Since(before) < 9*time.Millisecond {
			fmt.Println("sleep ended early")
		}
	}
}

func startHelper(t *testing.T) (parent, child int, out *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatalf("the helper said nothing: %v", sc.Err())
	}
	child, err = strconv.Atoi(strings.TrimSpace(sc.Text()))
	if err != nil {
		t.Fatalf("the helper said %q", sc.Text())
	}
	return cmd.Process.Pid, child, sc
}

func state(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0 // gone
	}
	s := string(b)
	return s[strings.LastIndexByte(s, ')')+2]
}

// Reap removes a zombie only a __WALL wait sees, and the parent, held for
// the call in the middle of a sleep, goes on as if nothing had happened.
func TestReapTakesTheZombieAndLeavesTheParentAsItWas(t *testing.T) {
	requireRoot(t)
	parent, child, out := startHelper(t)
	lines := make(chan string, 16)
	go func() {
		for out.Scan() {
			lines <- out.Text()
		}
	}()
	st, err := procfs.ReadStat(child)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(child, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for state(t, child) != 'Z' {
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not become a zombie (state %q)", child, state(t, child))
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		// The first reaps; the others find nothing to reap, and say so
		// without an error.
		if err := Reap(parent, child, st.StartTime); err != nil {
			t.Fatalf("Reap %d: %v", i, err)
		}
	}
	if s := state(t, child); s != 0 {
		t.Fatalf("child %d is still there (state %q) after Reap", child, s)
	}
	if s := state(t, parent); s != 'S' && s != 'R' {
		t.Fatalf("the parent is in state %q after Reap", s)
	}
	// Each held sleep was restarted: none failed, none ended early.
	settle := time.After(100 * time.Millisecond)
	for {
		select {
		case l := <-lines:
			t.Fatalf("the parent noticed the call: %s", l)
		case <-settle:
			return
		}
	}
}

// A parent stopped for job control (a suspended job) has its zombie reaped
// and stays stopped, running nothing of its own, with no new stop reported
// to its own parent; after a SIGCONT it goes on.
func TestReapOfAStoppedParentLeavesItStopped(t *testing.T) {
	requireRoot(t)
	parent, child, out := startHelper(t)
	lines := make(chan string, 16)
	go func() {
		for out.Scan() {
			lines <- out.Text()
		}
	}()
	st, err := procfs.ReadStat(child)
	if err != nil {
		t.Fatal(err)
	}
	unix.Kill(child, unix.SIGKILL)
	if err := unix.Kill(parent, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(parent, unix.SIGCONT)
	// The helper is this test's child: its stop is reported here, once.
	var ws unix.WaitStatus
	if _, err := unix.Wait4(parent, &ws, unix.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("the helper did not stop: %v %v", ws, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for state(t, child) != 'Z' {
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not become a zombie (state %q)", child, state(t, child))
		}
		time.Sleep(time.Millisecond)
	}
	if err := Reap(parent, child, st.StartTime); err != nil {
		t.Fatalf("Reap of a stopped parent: %v", err)
	}
	if s := state(t, child); s != 0 {
		t.Fatalf("child %d is still there (state %q) after Reap", child, s)
	}
	// Let go, the parent runs for an instant on its way back into the
	// stop, and then stays there.
	for deadline := time.Now().Add(2 * time.Second); state(t, parent) != 'T'; {
		if time.Now().After(deadline) {
			t.Fatalf("the stopped parent is in state %q after Reap, want it stopped again", state(t, parent))
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		if s := state(t, parent); s != 'T' {
			t.Fatalf("the stopped parent is in state %q after Reap, want it still stopped", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w, err := unix.Wait4(parent, &ws, unix.WUNTRACED|unix.WNOHANG, nil); w != 0 || err != nil {
		t.Fatalf("the helper's parent was told of something after Reap: %d %v %v", w, ws, err)
	}
	select {
	case l := <-lines:
		t.Fatalf("the stopped parent ran: %s", l)
	default:
	}
	// Continued, it runs on. (What its sleeps say is not looked at here:
	// SIGCONT alone interrupts some of a Go program's.)
	if err := unix.Kill(parent, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); state(t, parent) == 'T'; {
		if time.Now().After(deadline) {
			t.Fatal("the parent did not go on after SIGCONT")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 10; i++ {
		if s := state(t, parent); s != 'S' && s != 'R' {
			t.Fatalf("the parent is in state %q after SIGCONT", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestResumableRestartsInterruptedCalls(t *testing.T) {
	for _, c := range []struct {
		name           string
		orig, ax, want uint64
		ip, wantIP     uint64
	}{
		{"restartsys", 35, neg(512), 35, 1002, 1000},
		{"restartnointr", 35, neg(513), 35, 1002, 1000},
		{"restartnohand", 35, neg(514), 35, 1002, 1000},
		{"restartblock", 35, neg(516), unix.SYS_RESTART_SYSCALL, 1002, 1000},
		{"done", 35, 0, 0, 1002, 1002},
		{"no call", ^uint64(0), neg(512), neg(512), 1002, 1002},
	} {
		r := resumable(unix.PtraceRegs{Orig_rax: c.orig, Rax: c.ax, Rip: c.ip})
		if r.Rax != c.want || r.Rip != c.wantIP {
			t.Errorf("%s: rax %d rip %d, want %d and %d", c.name, int64(r.Rax), r.Rip, int64(c.want), c.wantIP)
		}
	}
}

func neg(n uint64) uint64 { return -n }

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "seizing other processes (or the same user and ptrace_scope 0)")
}
