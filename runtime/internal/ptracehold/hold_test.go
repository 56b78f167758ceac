package ptracehold

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/test/testenv"
	"golang.org/x/sys/unix"
)

// busy starts a shell whose loop rewrites a counter file as fast as it can,
// with a child doing the same, and returns their PIDs and files.
func busy(t *testing.T) (pids []int, files []string) {
	t.Helper()
	testenv.NeedRoot(t, "seizing other processes (or the same user and ptrace_scope 0)")
	dir := t.TempDir()
	for i := range 2 {
		f := filepath.Join(dir, fmt.Sprintf("c%d", i))
		cmd := exec.Command("sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > "$0"; done`, f)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids, files = append(pids, cmd.Process.Pid), append(files, f)
	}
	for _, f := range files {
		waitFor(t, func() bool { b, _ := os.ReadFile(f); return len(b) > 0 })
	}
	return pids, files
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func read(f string) string { b, _ := os.ReadFile(f); return strings.TrimSpace(string(b)) }

// advancing reports whether every file changes within a while.
func advancing(files []string) bool {
	before := make([]string, len(files))
	for i, f := range files {
		before[i] = read(f)
	}
	deadline := time.Now().Add(2 * time.Second)
	for i, f := range files {
		for read(f) == before[i] {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return true
}

// While held, no task runs and each is in a tracing stop; released, all run
// on.
func TestStopAndRelease(t *testing.T) {
	pids, files := busy(t)
	h, err := Stop(context.Background(), func() ([]int, error) { return pids, nil })
	if err != nil {
		t.Fatal(err)
	}
	if h.Tasks != len(pids) {
		t.Errorf("held %d tasks, want %d", h.Tasks, len(pids))
	}
	held := make([]string, len(files))
	for i, f := range files {
		held[i] = read(f)
	}
	time.Sleep(100 * time.Millisecond)
	for i, f := range files {
		if got := read(f); got != held[i] {
			t.Errorf("%s went on from %s to %s while held", f, held[i], got)
		}
	}
	for _, pid := range pids {
		if st := state(pid); st != "t" {
			t.Errorf("task %d in state %q while held, want t (tracing stop)", pid, st)
		}
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if !advancing(files) {
		t.Fatal("the tasks do not run after the release")
	}
}

func state(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return f[0]
}

// TestMain doubles as the holder TestKilledHolderLetsGo kills: with
// PTRACEHOLD_CHILD=PID,PID it holds those and waits to be killed.
func TestMain(m *testing.M) {
	if env := os.Getenv("PTRACEHOLD_CHILD"); env != "" {
		var pids []int
		for _, f := range strings.Split(env, ",") {
			var pid int
			fmt.Sscan(f, &pid)
			pids = append(pids, pid)
		}
		if _, err := Stop(context.Background(), func() ([]int, error) { return pids, nil }); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("holding")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A holder killed with SIGKILL lets its tasks go: the kernel detaches them.
func TestKilledHolderLetsGo(t *testing.T) {
	pids, files := busy(t)
	holder := exec.Command(os.Args[0])
	holder.Env = append(os.Environ(), fmt.Sprintf("PTRACEHOLD_CHILD=%d,%d", pids[0], pids[1]))
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "holding" {
		holder.Process.Kill()
		holder.Wait()
		t.Fatalf("the holder did not hold: %q %v", line, err)
	}
	if advancing(files[:1]) {
		t.Fatal("the tasks run while held")
	}
	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	if !advancing(files) {
		t.Fatal("the tasks stayed stopped after their holder was killed")
	}
}

// A task another process traces is not taken: the error names the tracer,
// and nothing stays held.
func TestTracedTaskRefused(t *testing.T) {
	pids, files := busy(t)
	attached := make(chan error)
	detach := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := unix.PtraceSeize(pids[1])
		attached <- err
		<-detach
		if err == nil {
			unix.PtraceInterrupt(pids[1])
			var ws unix.WaitStatus
			unix.Wait4(pids[1], &ws, unix.WALL, nil)
			unix.PtraceDetach(pids[1])
		}
	}()
	if err := <-attached; err != nil {
		t.Fatal(err)
	}
	defer close(detach)
	_, err := Stop(context.Background(), func() ([]int, error) { return pids, nil })
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("traced by process %d", os.Getpid())) {
		t.Fatalf("Stop of a traced task: %v, want it to name this process", err)
	}
	if !advancing(files[:1]) {
		t.Fatal("the untraced task was left stopped")
	}
}
