package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/test/testenv"
)

// asMainEnv makes the test binary behave as the workload binary. serve
// re-executes /proc/self/exe for its children, which in a test is the test
// binary, and they inherit the variable.
const asMainEnv = "WORKLOAD_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// workloadCmd runs the test binary as the workload binary.
func workloadCmd(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	return cmd
}

// TestServeEndToEnd starts serve with its whole tree, probes, mutates and
// writes to the eventfd through the real command line, then kills serve
// and checks that its children go away on their own.
func TestServeEndToEnd(t *testing.T) {
	if testing.Short() {
		testenv.Missing(t, "starts processes, which -short leaves out")
	}
	dir := t.TempDir()
	control := filepath.Join(dir, "control.sock")
	serve := workloadCmd("serve", "--state-dir", dir, "--control", control,
		"--unix-socket", filepath.Join(dir, "listen.sock"), "--tcp-port", "0", "--mem-mib", "4")
	var serveLog bytes.Buffer
	serve.Stderr = &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	var treePIDs []int
	t.Cleanup(func() {
		serve.Process.Kill()
		serve.Wait()
		for _, pid := range treePIDs {
			syscall.Kill(pid, syscall.SIGKILL) // only if one outlived serve
		}
		if t.Failed() {
			t.Logf("serve's log:\n%s", serveLog.String())
		}
	})

	ready := filepath.Join(dir, readyFileName)
	var pid []byte
	if !waitUntil(20*time.Second, func() bool {
		var err error
		pid, err = os.ReadFile(ready)
		return err == nil
	}) {
		t.Fatal("serve did not become ready")
	}
	if string(pid) != strconv.Itoa(serve.Process.Pid) {
		t.Fatalf("ready holds %q, want serve's pid %d", pid, serve.Process.Pid)
	}

	probe := func(args ...string) *Report {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := workloadCmd(append(args, "--control", control)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		if n := strings.Count(strings.TrimSpace(stdout.String()), "\n"); n != 0 {
			t.Fatalf("%v printed %d lines, want one JSON line", args, n+1)
		}
		var r Report
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stdout.String())
		}
		if len(r.Errors) != 0 {
			t.Errorf("%v reported errors: %q", args, r.Errors)
		}
		return &r
	}

	r := probe("probe", "--hash", "--reset-gap")
	for _, p := range r.Tree {
		treePIDs = append(treePIDs, p.PID)
	}
	switch {
	case len(r.Tree) != 4 || r.Tree[0].PID != serve.Process.Pid:
		t.Errorf("tree = %+v", r.Tree)
	case len(r.Threads) != counterThreadCount:
		t.Errorf("threads = %+v", r.Threads)
	case r.ThreadSigBlk != "0000000000000200":
		t.Errorf("thread_sigblk = %s", r.ThreadSigBlk)
	case r.FileOffset != offsetFilePos || r.FileSize != offsetFileSize:
		t.Errorf("file offset/size = %d/%d", r.FileOffset, r.FileSize)
	case r.DeletedPathExists || r.DeletedSHA256 == "":
		t.Errorf("deleted file: exists %v, sha256 %q", r.DeletedPathExists, r.DeletedSHA256)
	case !r.PipeRoundtrip || !r.SocketpairRoundtrip || !r.UnixListenRoundtrip:
		t.Errorf("round trips: pipe %v, socketpair %v, unix %v", r.PipeRoundtrip, r.SocketpairRoundtrip, r.UnixListenRoundtrip)
	case !r.TimerfdTicking || r.TimerfdIntervalNs != int64(timerInterval):
		t.Errorf("timerfd: ticking %v, interval %d", r.TimerfdTicking, r.TimerfdIntervalNs)
	case !r.FlockHeld || !r.PosixLockHeld || r.PosixLockPID != serve.Process.Pid:
		t.Errorf("locks: flock %v, posix %v by %d", r.FlockHeld, r.PosixLockHeld, r.PosixLockPID)
	case r.MemSHA256 == "" || !r.MemVerified || r.MemMiB != 4 || r.MemSeed != defaultMemSeed:
		t.Errorf("memory: sha256 %q verified %v, %d MiB seed %d", r.MemSHA256, r.MemVerified, r.MemMiB, r.MemSeed)
	case r.Tag != "initial" || !r.EpollOK:
		t.Errorf("tag %q, epoll_ok %v", r.Tag, r.EpollOK)
	case !strings.HasPrefix(r.TCPReply, "workload "+r.Hostname+" "):
		t.Errorf("tcp_reply = %q", r.TCPReply)
	}

	m := probe("mutate", "--tag", "x", "--mem")
	if m.Tag != "x" || m.MemSHA256 == "" || m.MemSHA256 == r.MemSHA256 || !m.MemVerified || m.Mutations != 1 {
		t.Errorf("after mutate: tag %q, sha256 %q (was %q), verified %v, mutations %d",
			m.Tag, m.MemSHA256, r.MemSHA256, m.MemVerified, m.Mutations)
	}
	e := probe("eventfd", "--n", "3")
	if e.EventfdTotal != r.EventfdTotal+3 || !e.EpollOK {
		t.Errorf("after eventfd --n 3: total %d (was %d), epoll_ok %v", e.EventfdTotal, r.EventfdTotal, e.EpollOK)
	}
	if p := probe("probe"); p.Counter <= r.Counter || p.MemSHA256 != "" || p.Tag != "x" {
		t.Errorf("later probe: counter %d (was %d), sha256 %q, tag %q", p.Counter, r.Counter, p.MemSHA256, p.Tag)
	}

	var stderr bytes.Buffer
	bad := workloadCmd("mutate", "--control", control, "--tag", "")
	bad.Stderr = &stderr
	if err := bad.Run(); err == nil {
		t.Error("mutate with an empty tag succeeded")
	}

	// Once serve is gone, every child sees EOF and exits.
	serve.Process.Kill()
	serve.Wait()
	if !waitUntil(10*time.Second, func() bool {
		for _, pid := range treePIDs[1:] {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) && !isZombie(pid) {
				return false
			}
		}
		return true
	}) {
		t.Error("children outlived serve")
	}

	stderr.Reset()
	unreachable := workloadCmd("probe", "--control", control)
	unreachable.Stderr = &stderr
	if err := unreachable.Run(); err == nil || !strings.Contains(stderr.String(), "cannot reach serve") {
		t.Errorf("probe without serve: %v, stderr %q", err, stderr.String())
	}
}

// isZombie reports whether pid has exited but was not reaped yet (children
// of serve are reparented to whatever reaps orphans here, maybe slowly).
func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(after, "Z")
}
