package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// report is the part of `workload probe`'s JSON the fidelity tests compare.
type report struct {
	Hostname string  `json:"hostname"`
	Mark     string  `json:"mark"`
	Cwd      string  `json:"cwd"`
	Counter  int64   `json:"counter"`
	MaxGapMs float64 `json:"max_gap_ms"`
	Tree     []struct {
		Role string `json:"role"`
		Pid  int    `json:"pid"`
		PPid int    `json:"ppid"`
		Pgid int    `json:"pgid"`
		Sid  int    `json:"sid"`
		Mark string `json:"mark"`
		Cwd  string `json:"cwd"`
	} `json:"tree"`
	Threads []struct {
		Tid   int   `json:"tid"`
		Count int64 `json:"count"`
	} `json:"threads"`
	ThreadsTicking      bool   `json:"threads_ticking"`
	ThreadSigBlk        string `json:"thread_sigblk"`
	FileOffset          int64  `json:"file_offset"`
	FileSize            int64  `json:"file_size"`
	DeletedPathExists   bool   `json:"deleted_path_exists"`
	DeletedSHA256       string `json:"deleted_sha256"`
	PipeRoundtrip       bool   `json:"pipe_roundtrip"`
	SocketpairRoundtrip bool   `json:"socketpair_roundtrip"`
	UnixListenRoundtrip bool   `json:"unix_listen_roundtrip"`
	TimerfdTicks        uint64 `json:"timerfd_ticks"`
	TimerfdTicking      bool   `json:"timerfd_ticking"`
	TimerfdIntervalNs   int64  `json:"timerfd_interval_ns"`
	MemSHA256           string `json:"mem_sha256"`
	MemVerified         bool   `json:"mem_verified"`
	Tag                 string `json:"tag"`
	FlockHeld           bool   `json:"flock_held"`
	PosixLockHeld       bool   `json:"posix_lock_held"`
	PosixLockPID        int    `json:"posix_lock_pid"`
	EventfdTotal        uint64 `json:"eventfd_total"`
	EpollOK             bool   `json:"epoll_ok"`
	TCPReply            string `json:"tcp_reply"`
	Errors              []string
}

// execer runs a command inside one container (crun/tclone exec or podman
// exec).
type execer func(t *testing.T, args ...string) result

func workloadCmd(t *testing.T, in execer, args ...string) report {
	t.Helper()
	var r report
	eventually(t, 30*time.Second, "workload "+args[0], func() error {
		out := in(t, append([]string{"/workload"}, args...)...)
		if out.code != 0 {
			return fmt.Errorf("exit %d: %s", out.code, out.stderr)
		}
		return json.Unmarshal([]byte(out.stdout), &r)
	})
	return r
}

// requireSameState checks that a sibling holds what the source held at the
// fork, field by field.
func requireSameState(t *testing.T, src, sib report) {
	t.Helper()
	if len(sib.Errors) > 0 {
		t.Errorf("sibling workload reports problems: %v", sib.Errors)
	}
	if len(src.Errors) > 0 {
		t.Errorf("source workload reports problems: %v", src.Errors)
	}
	same := func(what string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: source %v, sibling %v", what, a, b)
		}
	}
	// Process tree: namespace PIDs, parents, groups and sessions.
	same("process tree", src.Tree, sib.Tree)
	// Threads: the same thread IDs, all still ticking.
	var srcTids, sibTids []int
	for _, th := range src.Threads {
		srcTids = append(srcTids, th.Tid)
	}
	for _, th := range sib.Threads {
		sibTids = append(sibTids, th.Tid)
	}
	same("thread IDs", srcTids, sibTids)
	if !sib.ThreadsTicking {
		t.Error("sibling threads are not all running")
	}
	same("environment mark", src.Mark, sib.Mark)
	same("cwd", src.Cwd, sib.Cwd)
	same("file offset", src.FileOffset, sib.FileOffset)
	same("file size", src.FileSize, sib.FileSize)
	same("deleted-but-open file content", src.DeletedSHA256, sib.DeletedSHA256)
	if sib.DeletedPathExists {
		t.Error("the deleted file has a name again in the sibling")
	}
	same("signal mask", src.ThreadSigBlk, sib.ThreadSigBlk)
	same("timer interval", src.TimerfdIntervalNs, sib.TimerfdIntervalNs)
	if !sib.TimerfdTicking || sib.TimerfdTicks < src.TimerfdTicks {
		t.Errorf("sibling timerfd: ticking %v, ticks %d (source had %d)", sib.TimerfdTicking, sib.TimerfdTicks, src.TimerfdTicks)
	}
	for what, ok := range map[string]bool{
		"pipe round trip": sib.PipeRoundtrip, "socketpair round trip": sib.SocketpairRoundtrip,
		"listening unix socket": sib.UnixListenRoundtrip, "epoll": sib.EpollOK,
		"flock held": sib.FlockHeld, "POSIX lock held": sib.PosixLockHeld,
	} {
		if !ok {
			t.Errorf("sibling: %s failed", what)
		}
	}
	same("POSIX lock owner", src.PosixLockPID, sib.PosixLockPID)
	same("eventfd total", src.EventfdTotal, sib.EventfdTotal)
	if src.MemSHA256 == "" || !sib.MemVerified {
		t.Errorf("memory not verified (source hash %q, sibling verified %v)", src.MemSHA256, sib.MemVerified)
	}
	same("memory hash", src.MemSHA256, sib.MemSHA256)
	same("memory tag", src.Tag, sib.Tag)
	if !strings.HasPrefix(sib.TCPReply, "workload "+sib.Hostname+" ") {
		t.Errorf("sibling's TCP listener answered %q in its own network namespace", sib.TCPReply)
	}
}

// requireDiverged mutates each side and checks the other does not see it.
func requireDiverged(t *testing.T, srcExec, sibExec execer) {
	t.Helper()
	before := workloadCmd(t, srcExec, "probe", "--hash")
	afterSib := workloadCmd(t, sibExec, "mutate", "--tag", "sibling-only", "--mem")
	if afterSib.Tag != "sibling-only" || afterSib.MemSHA256 == before.MemSHA256 {
		t.Fatalf("sibling mutate did not take: %+v", afterSib.Tag)
	}
	src := workloadCmd(t, srcExec, "probe", "--hash")
	if src.Tag != before.Tag || src.MemSHA256 != before.MemSHA256 {
		t.Errorf("a sibling write reached the source: tag %q, hash changed %v", src.Tag, src.MemSHA256 != before.MemSHA256)
	}
	workloadCmd(t, srcExec, "mutate", "--tag", "source-only")
	if sib := workloadCmd(t, sibExec, "probe"); sib.Tag != "sibling-only" {
		t.Errorf("a source write reached the sibling: tag %q", sib.Tag)
	}
	sibEv := workloadCmd(t, sibExec, "eventfd", "--n", "3")
	srcEv := workloadCmd(t, srcExec, "probe")
	if sibEv.EventfdTotal != before.EventfdTotal+3 || srcEv.EventfdTotal != before.EventfdTotal {
		t.Errorf("eventfd totals: sibling %d, source %d, before %d", sibEv.EventfdTotal, srcEv.EventfdTotal, before.EventfdTotal)
	}
	// Files diverge too.
	if r := sibExec(t, "sh", "-c", "echo sibling > /var/tmp/workload/diverge"); r.code != 0 {
		t.Fatalf("write in sibling: %s", r.stderr)
	}
	if r := srcExec(t, "cat", "/var/tmp/workload/diverge"); r.code == 0 {
		t.Errorf("a sibling file appeared in the source: %q", r.stdout)
	}
}

// The fidelity suite on a bare bundle: busybox plus the static workload,
// bind-mounted from the host (an external mount the sibling remaps to its
// own copy). It needs no Podman, so the kernel VM's stack stage runs it too:
// there, with vma_cherrypick loaded, the fork is copy-on-write, and the
// sibling's memory comes from the snapshots.
func TestFidelityBundle(t *testing.T) {
	requireBundleStack(t)
	if _, err := os.Stat(workloadBin()); err != nil {
		t.Fatalf("workload binary: %v (make build)", err)
	}
	srcBin, sibBin := t.TempDir(), t.TempDir()
	copyWorkload(t, srcBin)
	copyWorkload(t, sibBin)
	args := []string{"/opt/wl/workload", "serve", "--mem-mib", fidelityMemMiB(), "--tcp-port", "8080"}
	src := newBundle(t, "src", true, args...)
	src.spec.Mounts = append(src.spec.Mounts, mountBind("/opt/wl", srcBin))
	src.save(t)
	sib := newBundle(t, "sib", false, args...)
	sib.spec.Mounts = append(sib.spec.Mounts, mountBind("/opt/wl", sibBin))
	sib.save(t)
	src.start(t)
	srcExec := func(t *testing.T, a ...string) result { return src.exec(t, rewriteWorkload(a)...) }
	sibExec := func(t *testing.T, a ...string) result { return sib.exec(t, rewriteWorkload(a)...) }
	memory := "auto"
	if cowLoaded(t) {
		memory = "cow"
	}
	forkAndCompare(t, srcExec, sibExec, func() result {
		r := forkBundle(t, src, sib, nil, "--file-locks", "--memory", memory, "--print-stats")
		if r.code == 0 {
			stats := forkReport(t, r)
			got := stats.Sibling.Memory
			if memory == "cow" && (got != "cow" || stats.Sibling.Share == nil || stats.Sibling.Share.Areas == 0) {
				t.Fatalf("the sibling's memory %q, share %+v: want the snapshots' pages", got, stats.Sibling.Share)
			}
			t.Logf("sibling memory: %s", got)
		}
		return r
	})
	if h := sib.mustExec(t, "hostname"); h != "sib" {
		t.Errorf("sibling hostname %q", h)
	}
}

// fidelityMemMiB is the bundle workload's memory: 256 MiB, or
// TCLONE_FIDELITY_MEM_MIB (the kernel VM, where the emulated CPU hashes and
// checks 256 MiB in about a minute, sets 32).
func fidelityMemMiB() string {
	if v := os.Getenv("TCLONE_FIDELITY_MEM_MIB"); v != "" {
		return v
	}
	return "256"
}

// The fidelity suite through Podman on the Debian workspace image, where the
// workload runs as a child of bash.
func TestFidelityPodmanWorkspace(t *testing.T) {
	requireStack(t)
	src := name(t, "fid")
	podman(t, "run", "-d", "--name", src, "-v", workloadBin()+":/workload:ro", workspace,
		"bash", "-c", "/workload serve --mem-mib 256 --tcp-port 8080; sleep infinity")
	srcExec := func(t *testing.T, a ...string) result { return podmanTry(t, append([]string{"exec", src}, a...)...) }
	var sibName string
	sibExec := func(t *testing.T, a ...string) result {
		return podmanTry(t, append([]string{"exec", sibName}, a...)...)
	}
	forkAndCompare(t, srcExec, sibExec, func() result {
		r := run(t, 3*time.Minute, podmanForkBin(), "--file-locks", "--format", "json", src)
		if r.code == 0 {
			var out []struct{ Name string }
			json.Unmarshal([]byte(r.stdout), &out)
			if len(out) == 1 {
				sibName = out[0].Name
			}
		}
		return r
	})
}

// forkAndCompare is the fidelity procedure: observe the source, write a file,
// fork, write another, then compare, check continuity and divergence.
func forkAndCompare(t *testing.T, srcExec, sibExec execer, doFork func() result) {
	t.Helper()
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	workloadCmd(t, srcExec, "probe") // waits until serve is up
	if r := srcExec(t, "sh", "-c", "echo before > /var/tmp/workload/before"); r.code != 0 {
		t.Fatalf("write before fork: %s", r.stderr)
	}
	pre := workloadCmd(t, srcExec, "probe", "--hash", "--reset-gap")
	step("source observed")
	if r := doFork(); r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	step("forked")
	if r := srcExec(t, "sh", "-c", "echo after > /var/tmp/workload/after"); r.code != 0 {
		t.Fatalf("write after fork: %s", r.stderr)
	}
	sib := workloadCmd(t, sibExec, "probe", "--hash")
	src := workloadCmd(t, srcExec, "probe", "--hash")
	step("both observed")
	// The memory of both is the memory of the fork instant.
	requireSameState(t, pre, sib)
	requireSameState(t, pre, src)
	// The counter: the sibling continues from the fork instant, and the
	// source went on counting through it.
	if sib.Counter < pre.Counter {
		t.Errorf("sibling counter %d is behind the source's before the fork (%d)", sib.Counter, pre.Counter)
	}
	if src.Counter <= pre.Counter {
		t.Errorf("source counter did not advance through the fork: %d then %d", pre.Counter, src.Counter)
	}
	later := workloadCmd(t, sibExec, "probe")
	if later.Counter <= sib.Counter {
		t.Errorf("sibling counter stuck at %d", sib.Counter)
	}
	t.Logf("source pause seen by the source's 1 ms ticker: %.1f ms", src.MaxGapMs)
	// Files: written before the fork are there, after are not.
	if r := sibExec(t, "cat", "/var/tmp/workload/before"); strings.TrimSpace(r.stdout) != "before" {
		t.Errorf("file written before the fork: %q (exit %d)", r.stdout, r.code)
	}
	if r := sibExec(t, "cat", "/var/tmp/workload/after"); r.code == 0 {
		t.Errorf("file written after the fork reached the sibling: %q", r.stdout)
	}
	requireDiverged(t, srcExec, sibExec)
}

func mountBind(dst, src string) specsMount {
	return specsMount{Destination: dst, Source: src, Type: "bind", Options: []string{"rbind", "ro"}}
}

// rewriteWorkload maps the podman-style /workload path to the bundle's.
func rewriteWorkload(a []string) []string {
	if len(a) > 0 && a[0] == "/workload" {
		return append([]string{"/opt/wl/workload"}, a[1:]...)
	}
	return a
}

// ghostPy writes 10 MiB to a temporary file, deletes it and keeps it open,
// as a test runner's captured output or an editor's swap file may; on each
// /tmp/go it writes to /tmp/ghost the size and a hash of what it reads back.
const ghostPy = `import hashlib, os, time
f = open("/var/tmp/scratch", "wb+")
f.write(bytes(range(256)) * (40 << 10))
f.flush()
os.unlink("/var/tmp/scratch")
while True:
    if os.path.exists("/tmp/go"):
        os.remove("/tmp/go")
        f.seek(0)
        data = f.read()
        with open("/tmp/ghost.tmp", "w") as out:
            out.write("%d %s" % (len(data), hashlib.sha256(data).hexdigest()))
        os.rename("/tmp/ghost.tmp", "/tmp/ghost")
    time.sleep(0.02)
`

// A deleted file a process still holds open goes with the fork up to the
// ghost limit (64M by default, where CRIU's own 1M failed such forks); above
// it the fork fails saying which flag to give, and leaves nothing behind.
func TestForkDeletedOpenFile(t *testing.T) {
	requireStack(t)
	src := name(t, "ghost")
	podman(t, "run", "-d", "--name", src, "-e", "GHOSTPY="+ghostPy, workspace, "bash", "-c", `exec python3 -c "$GHOSTPY"`)
	read := func(ctr string) string { return poke(t, ctr, "/tmp/ghost") }
	want := read(src)
	if !strings.HasPrefix(want, "10485760 ") {
		t.Fatalf("the source reads %q from its deleted file", want)
	}
	r := run(t, 3*time.Minute, podmanForkBin(), "--ghost-limit", "1M", "--name", src+"-small", src)
	if r.code == 0 || !strings.Contains(r.stderr, "--ghost-limit") {
		t.Fatalf("fork with --ghost-limit 1M: exit %d: %s; want a failure naming --ghost-limit", r.code, r.stderr)
	}
	if out := podmanTry(t, "container", "exists", src+"-small"); out.code == 0 {
		t.Errorf("the failed fork left its sibling")
	}
	r = run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
	if r.code != 0 {
		t.Fatalf("fork: exit %d: %s", r.code, r.stderr)
	}
	if got := read(src + "-f"); got != want {
		t.Errorf("the sibling reads %q from the deleted file, want %q as the source", got, want)
	}
	if got := read(src); got != want {
		t.Errorf("the source reads %q after the fork, want %q", got, want)
	}
}

// tracedPy is a process traced by its parent, as under a debugger.
const tracedPy = `import ctypes, os, signal, time
libc = ctypes.CDLL("libc.so.6")
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, 0, 0)  # PTRACE_TRACEME
    os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(0.1)
os.waitpid(pid, os.WUNTRACED)
libc.ptrace(7, pid, 0, 0)  # PTRACE_CONT
open("/tmp/traced", "w").write(str(pid))
while True:
    time.sleep(0.1)
`

// A process under a debugger cannot be captured: the fork fails naming it
// and its tracer and saying what to do, and the source runs on, with no
// sibling left.
func TestForkOfATracedProcessSaysWhy(t *testing.T) {
	requireStack(t)
	src := name(t, "traced")
	podman(t, "run", "-d", "--name", src, "-e", "TRACEDPY="+tracedPy, workspace, "bash", "-c", `exec python3 -c "$TRACEDPY"`)
	eventually(t, 10*time.Second, "the traced process", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/tmp/traced"); r.code != 0 {
			return fmt.Errorf("%s", r.stderr)
		}
		return nil
	})
	r := run(t, 3*time.Minute, podmanForkBin(), "--name", src+"-f", src)
	if r.code == 0 || !strings.Contains(r.stderr, "is traced by process") || !strings.Contains(r.stderr, "(python3)") {
		t.Fatalf("fork of a traced process: exit %d: %s; want a failure naming the process and its tracer", r.code, r.stderr)
	}
	if podmanTry(t, "container", "exists", src+"-f").code == 0 {
		t.Error("the failed fork left its sibling")
	}
	if st := podman(t, "inspect", "--format", "{{.State.Status}}", src); st != "running" {
		t.Errorf("the source is %s after the failed fork", st)
	}
	if r := podmanTry(t, "exec", src, "true"); r.code != 0 {
		t.Errorf("the source does not run commands after the failed fork: %s", r.stderr)
	}
}
