package lazypages

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/test/pattern"
	"github.com/tclone/tclone/test/testenv"
)

// These tests restore a real process with the installed CRIU and the daemon
// (lazypagesd, a separate process so that it can be killed). They need root,
// CRIU with userfaultfd support, and the go tool to build the two helper
// programs; without them they skip, or fail under
// TCLONE_REQUIRE=1 (test/testenv).

type criuEnv struct {
	criu    string
	bin     string // memfill, lazypagesd
	scratch string // on tmpfs, like tclone's store
}

var (
	helpersOnce sync.Once
	helpersDir  string
	helpersErr  error
)

func requireCRIU(t testing.TB) *criuEnv {
	t.Helper()
	criu, reason := findCRIU()
	if reason != "" {
		testenv.Missing(t, "CRIU lazy-pages test cannot run: %s", reason)
	}
	helpersOnce.Do(findHelpers)
	if helpersErr != nil {
		t.Fatalf("building the test programs: %v", helpersErr)
	}
	scratch, err := os.MkdirTemp("/dev/shm", "lazypages-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	watchCrashes(t)
	return &criuEnv{criu: criu, bin: helpersDir, scratch: scratch}
}

// watchCrashes fails t if a memfill process dies of a fault while it runs:
// memfill never faults on the memory it was given, so a fault means a
// restored task read wrong memory (zeros where the source had data). Such
// a task often cannot say so itself (with its runtime's memory gone, Go
// finds no goroutine and dies silently), but the kernel logs the fault.
func watchCrashes(t testing.TB) {
	t.Helper()
	// Raw reads: os.File would wait in the poller instead of reporting
	// the end of the log.
	fd, err := syscall.Open("/dev/kmsg", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("reading the kernel log for crashes: %v", err)
	}
	if _, err := syscall.Seek(fd, 0, io.SeekEnd); err != nil {
		syscall.Close(fd)
		t.Fatalf("reading the kernel log for crashes: %v", err)
	}
	t.Cleanup(func() {
		defer syscall.Close(fd)
		buf := make([]byte, 8192)
		for {
			n, err := syscall.Read(fd, buf)
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EINTR) {
				continue // records overwritten meanwhile: read on
			}
			if err != nil || n <= 0 {
				return
			}
			if rec := string(buf[:n]); strings.Contains(rec, "memfill[") && strings.Contains(rec, "segfault") {
				t.Errorf("a memfill process crashed, so it read wrong memory: %s", strings.TrimSpace(rec[strings.Index(rec, ";")+1:]))
			}
		}
	})
}

func findCRIU() (string, string) {
	if os.Geteuid() != 0 {
		return "", "not root"
	}
	criu, err := exec.LookPath("criu")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/criu"); serr != nil {
			return "", "criu not found"
		}
		criu = "/usr/sbin/criu"
	}
	out, err := exec.Command(criu, "check", "--feature", "uffd-noncoop").CombinedOutput()
	if err != nil {
		return "", fmt.Sprintf("criu check --feature uffd-noncoop: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return criu, ""
}

// findHelpers finds the test programs: built already where
// TCLONE_LAZYPAGES_HELPERS says (a machine without the go tool, such as the
// VM that runs these tests with the module), or built now.
func findHelpers() {
	if dir := os.Getenv("TCLONE_LAZYPAGES_HELPERS"); dir != "" {
		helpersDir = dir
		return
	}
	buildHelpers()
}

func buildHelpers() {
	helpersDir, helpersErr = os.MkdirTemp("", "lazypages-bin-")
	if helpersErr != nil {
		return
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		helpersErr = fmt.Errorf("the go tool is needed to build the test programs: %w", err)
		return
	}
	for _, prog := range []string{"memfill", "lazypagesd"} {
		cmd := exec.Command(gotool, "build", "-o", filepath.Join(helpersDir, prog), "../../test/cmd/"+prog)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			helpersErr = fmt.Errorf("go build %s: %v: %s", prog, err, out)
			return
		}
	}
}

// memProc is a memfill process: the source, or a restored sibling.
type memProc struct {
	pid int
	dir string // where it reads requests
	// stderr is this process's own standard error: a restored process
	// that crashed (a Go runtime reading wrong memory) says so there.
	stderr string
}

// ask sends a request and waits for the answer.
func (m memProc) ask(cmd string, timeout time.Duration) (string, error) {
	req := filepath.Join(m.dir, fmt.Sprintf("%d.req", m.pid))
	resp := filepath.Join(m.dir, fmt.Sprintf("%d.resp", m.pid))
	os.Remove(resp)
	if err := os.WriteFile(req+".tmp", []byte(cmd), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(req+".tmp", req); err != nil {
		return "", err
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(500 * time.Microsecond) {
		if b, err := os.ReadFile(resp); err == nil {
			os.Remove(resp)
			return string(b), nil
		}
		if gone(m.pid) {
			if b, _ := os.ReadFile(m.stderr); m.stderr != "" && len(b) > 0 {
				return "", fmt.Errorf("%w: %s", errCrashed, b[:min(len(b), 2048)])
			}
			return "", errGone
		}
	}
	return "", fmt.Errorf("pid %d did not answer %q in %s", m.pid, cmd, timeout)
}

var (
	errGone = errors.New("process gone")
	// errCrashed: the process is gone, and wrote on its way out.
	errCrashed = errors.New("process crashed")
)

// stderrFile, in the request directory, is the source's standard error.
// Each restore gives its process a file of its own instead (restore).
const stderrFile = "memfill.stderr"

func (m memProc) kill() { syscall.Kill(m.pid, syscall.SIGKILL) }

// dump starts memfill with mib MiB in a new PID namespace, dumps it with
// --leave-running as tclone does, and kills it. It returns the images
// directory and the source's hash.
func (e *criuEnv) dump(t *testing.T, mib int) (string, string) {
	t.Helper()
	return e.dumpTree(t, mib, 0)
}

// dumpTree is dump of a memfill with children.
func (e *criuEnv) dumpTree(t *testing.T, mib, children int) (string, string) {
	t.Helper()
	src, hash := e.startSource(t, mib, children)
	defer src.kill()
	images := filepath.Join(e.scratch, fmt.Sprintf("images-%d", mib))
	os.MkdirAll(images, 0o755)
	out, err := criuCommand(e.criu, "dump", "-t", strconv.Itoa(src.pid), "-D", images,
		"--leave-running", "-o", "dump.log", "-v4").CombinedOutput()
	if err != nil {
		t.Fatalf("criu dump: %v: %s\n%s", err, out, criuErrors(filepath.Join(images, "dump.log")))
	}
	return images, hash
}

// startSource starts memfill with mib MiB and children in a new PID
// namespace and returns it, with the hash of its memory, once filled. It is
// killed when the test ends.
func (e *criuEnv) startSource(t testing.TB, mib, children int) (memProc, string) {
	t.Helper()
	dir := filepath.Join(e.scratch, "ask")
	os.MkdirAll(dir, 0o755)
	cmd := exec.Command(filepath.Join(e.bin, "memfill"), "-mib", strconv.Itoa(mib), "-dir", dir,
		"-children", strconv.Itoa(children))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	// The source's stderr is a file, so that every process restored from
	// it writes there too: a Go runtime that crashes says why.
	stderr, err := os.OpenFile(filepath.Join(dir, stderrFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	hashFile := filepath.Join(dir, "source.hash")
	os.Remove(hashFile)
	var hash []byte
	for deadline := time.Now().Add(60 * time.Second); len(hash) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("memfill did not write its hash")
		}
		hash, _ = os.ReadFile(hashFile)
	}
	return memProc{pid: cmd.Process.Pid, dir: dir, stderr: filepath.Join(dir, stderrFile)}, string(hash)
}

// criuStepTimeout bounds one criu dump or restore of a test: a CRIU that
// waits forever (on a daemon that never answers, say) fails the test
// instead of hanging the whole run.
const criuStepTimeout = 2 * time.Minute

// criuCommand is criu with args, killed when criuStepTimeout passes.
func criuCommand(criu string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), criuStepTimeout)
	cmd := exec.CommandContext(ctx, criu, args...)
	// The context lives as long as the process: cancel once it is reaped.
	cmd.Cancel = func() error { defer cancel(); return cmd.Process.Kill() }
	time.AfterFunc(criuStepTimeout+time.Second, cancel)
	return cmd
}

func criuErrors(log string) string {
	b, _ := os.ReadFile(log)
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
			errs = append(errs, l)
		}
	}
	return strings.Join(errs, "\n")
}

// restoreAtPreResume starts a lazy criu restore -d of images with work as
// its work directory and script as its action script, and returns once the
// script has touched marker at pre-resume: CRIU then holds every restored
// task stopped until the script returns. The channel gives the restore's
// end.
func (e *criuEnv) restoreAtPreResume(t *testing.T, images, work, script, marker string) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := criuCommand(e.criu, "restore", "-D", images, "-W", work, "-d", "--pidfile", filepath.Join(work, "pid"),
		"-o", "restore.log", "-v4", "--lazy-pages", "--action-script", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() { result <- cmd.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			return cmd, result
		}
		select {
		case err := <-result:
			cmd.Process.Kill()
			t.Fatalf("the restore ended before its pre-resume script ran: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("CRIU did not reach its pre-resume script")
		}
	}
}

// restore runs criu restore -d of images with work as its work directory,
// and returns the restored root's host pid.
func (e *criuEnv) restore(images, work string, lazy bool, extra ...string) (memProc, error) {
	os.MkdirAll(work, 0o755)
	pidfile := filepath.Join(work, "pid")
	os.Remove(pidfile)
	args := []string{"restore", "-D", images, "-W", work, "-d", "--pidfile", pidfile, "-o", "restore.log", "-v4"}
	if lazy {
		args = append(args, "--lazy-pages")
	}
	args = append(args, extra...)
	// The restored process's standard error is a file of its own, in place
	// of the source's (CRIU matches an inherited file by its path).
	dir := filepath.Join(e.scratch, "ask")
	stderrPath := filepath.Join(work, "stderr")
	stderr, err := os.OpenFile(stderrPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return memProc{}, err
	}
	defer stderr.Close()
	args = append(args, "--inherit-fd", "fd[3]:"+strings.TrimPrefix(filepath.Join(dir, stderrFile), "/"))
	cmd := criuCommand(e.criu, args...)
	cmd.ExtraFiles = []*os.File{stderr}
	if out, err := cmd.CombinedOutput(); err != nil {
		return memProc{}, fmt.Errorf("criu restore: %v: %s\n%s", err, out, criuErrors(filepath.Join(work, "restore.log")))
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return memProc{}, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return memProc{pid: pid, dir: dir, stderr: stderrPath}, err
}

// daemonLine is one line of lazypagesd's output.
type daemonLine struct {
	Event
	At    int64       `json:"at_ns"`
	Error string      `json:"error"`
	Dump  *dumpReport `json:"dump"`
}

// dumpReport is lazypagesd -dump's report of its copy-on-write dump.
type dumpReport struct {
	DumpMs        float64 `json:"dump_ms"`
	SnapshotMs    float64 `json:"snapshot_ms"`
	PagesWritten  uint64  `json:"pages_written"`
	SnapshotPages uint64  `json:"snapshot_pages"`
	Processes     int     `json:"processes"`
}

type daemonProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []daemonLine
	update chan struct{}
	exited chan struct{}
}

func (e *criuEnv) startDaemon(t testing.TB, images string, sockets []string, pause time.Duration, more ...string) *daemonProc {
	t.Helper()
	args := append([]string{"-images", images, "-chunk-pause", pause.String()}, more...)
	for _, s := range sockets {
		args = append(args, "-socket", s)
	}
	cmd := exec.Command(filepath.Join(e.bin, "lazypagesd"), args...)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, update: make(chan struct{}, 1), exited: make(chan struct{})}
	go d.read(out)
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-d.exited })
	d.wait(t, "listening", 1, 10*time.Second)
	return d
}

func (d *daemonProc) read(out interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var l daemonLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			d.mu.Lock()
			d.lines = append(d.lines, l)
			d.mu.Unlock()
			select {
			case d.update <- struct{}{}:
			default:
			}
		}
	}
	d.cmd.Wait()
	close(d.exited)
}

func (d *daemonProc) find(kind EventKind) []daemonLine {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []daemonLine
	for _, l := range d.lines {
		if l.Kind == kind {
			out = append(out, l)
		}
	}
	return out
}

func (d *daemonProc) wait(t testing.TB, kind EventKind, n int, timeout time.Duration) []daemonLine {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if got := d.find(kind); len(got) >= n {
			return got
		}
		select {
		case <-d.update:
		case <-d.exited:
			if got := d.find(kind); len(got) >= n {
				return got
			}
			t.Fatalf("lazypagesd exited before %d %q events: %+v", n, kind, d.lines)
		case <-deadline:
			t.Fatalf("no %d %q events from lazypagesd in %s: %+v", n, kind, timeout, d.lines)
		}
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// TestCRIULazyRestore restores the same dump with plain CRIU and with
// --lazy-pages and this daemon: the lazy sibling answers before its memory
// is complete, and its memory hash matches the source's.
func TestCRIULazyRestore(t *testing.T) {
	sizes := []int{256, 1024}
	if testing.Short() {
		sizes = sizes[:1]
	}
	for _, mib := range sizes {
		t.Run(fmt.Sprintf("%dMiB", mib), func(t *testing.T) { lazyVersusPlain(t, mib) })
	}
}

func lazyVersusPlain(t *testing.T, mib int) {
	e := requireCRIU(t)
	images, want := e.dump(t, mib)

	start := time.Now()
	plain, err := e.restore(images, filepath.Join(e.scratch, "plain"), false)
	if err != nil {
		t.Fatal(err)
	}
	plainRestored := time.Since(start)
	if _, err := plain.ask("ping", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	plainPing := time.Since(start)
	if got, err := plain.ask("hash", 60*time.Second); err != nil || got != want {
		t.Fatalf("plain restore: hash %q, %v; source %q", got, err, want)
	}
	plain.kill()

	work := filepath.Join(e.scratch, "lazy")
	os.MkdirAll(work, 0o755)
	// The background fill waits an hour between chunks, so the sibling's
	// memory comes almost all by its own faults: it answers a ping long
	// before it has every page, however late the host schedules it, and
	// its memory is complete only once the hash has read all of it. What
	// this proves is the order of events, not a speed (make bench times
	// lazy restores).
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, time.Hour)
	start = time.Now()
	lazy, err := e.restore(images, work, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.kill()
	lazyRestored := time.Since(start)
	if _, err := lazy.ask("ping", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	lazyPing := time.Since(start)
	if done := d.find(EventComplete); len(done) > 0 {
		t.Fatalf("the lazy sibling's memory was complete before its first answer: %+v", done)
	}
	if got, err := lazy.ask("hash", 5*time.Minute); err != nil || got != want {
		t.Fatalf("lazy restore: hash %q, %v; source %q", got, err, want)
	}
	done := d.wait(t, EventComplete, 1, 60*time.Second)[0]
	lazyComplete := time.Duration(done.At - start.UnixNano())
	st := done.Stats
	// A dump made without --lazy-pages marks the filled memory lazy: the
	// restore left all of it to the daemon.
	if st.LazyBytes < uint64(mib)<<20 {
		t.Fatalf("only %d bytes of the %d MiB filled were lazy in the dump", st.LazyBytes, mib)
	}
	if copied := (st.FaultPages + st.BackgroundPages) * pageSize; copied != st.LazyBytes {
		t.Fatalf("daemon copied %d bytes of %d lazy bytes: %+v", copied, st.LazyBytes, st)
	}
	if st.FaultPages == 0 {
		t.Fatalf("no page came by fault with the background fill held back: %+v", st)
	}
	t.Logf("%d MiB, plain restore: criu returned %s, first answer %s (memory complete when criu returns)",
		mib, ms(plainRestored), ms(plainPing))
	t.Logf("%d MiB, lazy restore:  criu returned %s, first answer %s, memory complete by the hash's faults %s (%d faults, %d MiB by fault, %d MiB in background)",
		mib, ms(lazyRestored), ms(lazyPing), ms(lazyComplete), st.Faults, st.FaultPages*pageSize>>20, st.BackgroundPages*pageSize>>20)
}

// TestCRIULazyEventsWhileFilling: while its memory is still filling (the
// daemon paces its background copies), the sibling discards part of it
// (MADV_DONTNEED), moves it (mremap), and forks a child that reads all of it;
// the child's hash, and later the sibling's, match the source's memory with
// the discarded pages zeroed.
func TestCRIULazyEventsWhileFilling(t *testing.T) {
	const mib = 256
	e := requireCRIU(t)
	images, _ := e.dump(t, mib)
	work := filepath.Join(e.scratch, "lazy")
	os.MkdirAll(work, 0o755)
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, 30*time.Millisecond)
	sib, err := e.restore(images, work, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sib.kill()
	if filling, err := Filling(sib.pid); err != nil || !filling {
		t.Fatalf("Filling(%d) right after a paced lazy restore = %v, %v", sib.pid, filling, err)
	}
	const discard = 1000 // pages
	want := pattern.Format(pattern.Expected(mib<<20/8, discard*pageSize/8))
	for _, c := range []struct{ cmd, want string }{
		{fmt.Sprintf("dontneed %d", discard), "ok"},
		{"remap", "ok"},
		{"forkhash", want},
	} {
		if got, err := sib.ask(c.cmd, 60*time.Second); err != nil || got != c.want {
			t.Fatalf("%s while filling: %q, %v; want %q", c.cmd, got, err, c.want)
		}
		if len(d.find(EventComplete)) > 0 {
			t.Fatalf("memory was complete before %q could run while filling; pace the daemon more", c.cmd)
		}
	}
	done := d.wait(t, EventComplete, 1, 120*time.Second)[0]
	t.Logf("sibling stats: %+v", *done.Stats)
	if filling, err := Filling(sib.pid); err != nil || filling {
		t.Fatalf("Filling(%d) after the daemon completed the sibling = %v, %v", sib.pid, filling, err)
	}
	if got, err := sib.ask("hash", 30*time.Second); err != nil || got != want {
		t.Fatalf("hash after the fill: %q, %v; want %q", got, err, want)
	}
}

// TestCRIULazyDaemonKilledMidFill restores three siblings of one dump at
// once, has each of them hash its memory at once (so they fault while they
// fill; the first one hashes in a forked child, whose memory the daemon
// knows only through the fork event), and SIGKILLs the daemon at a random
// moment: during the restores,
// while they fill, or after. Every sibling must end up either gone or
// answering the source's hash; one that answers anything else, or lives on
// without answering, has wrong memory. Nothing of the daemon, its guard, or a
// failed restore may be left.
func TestCRIULazyDaemonKilledMidFill(t *testing.T) {
	const mib, siblings = 256, 3
	rounds := 8
	if testing.Short() {
		rounds = 2
	}
	e := requireCRIU(t)
	images, want := e.dump(t, mib)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	for round := range rounds {
		delay := time.Duration(rng.Int63n(int64(time.Second)))
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			watchCrashes(t)
			outcomes := killRound(t, e, images, want, siblings, delay, round)
			t.Logf("round %d: daemon killed %s after the restores began: %s", round, ms(delay), strings.Join(outcomes, ", "))
		})
	}
}

// TestCRIULazyDaemonStopsWhileCRIUHoldsTheTasks kills the daemon (its guard
// acts), or closes it (the daemon acts), while CRIU is in its last restore
// stage with every task seized (a pre-resume action script holds it there).
// The tasks are killed; CRIU then fails the restore, and would wait for ever
// for the root (a PID namespace's init with threads) if CRIU were not killed
// too. The restore must end at once, with an error, and leave no task.
func TestCRIULazyDaemonStopsWhileCRIUHoldsTheTasks(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) { daemonStopsAtPreResume(t, sig) })
	}
}

func daemonStopsAtPreResume(t *testing.T, sig syscall.Signal) {
	e := requireCRIU(t)
	images, _ := e.dump(t, 64)
	work := filepath.Join(e.scratch, "pre-resume")
	os.MkdirAll(work, 0o755)
	marker := filepath.Join(work, "at-pre-resume")
	script := filepath.Join(work, "hold.sh")
	hold := fmt.Sprintf("#!/bin/sh\nexec >/dev/null 2>&1\n[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-resume ] || exit 0\ntouch %s\nsleep 5\n", marker)
	if err := os.WriteFile(script, []byte(hold), 0o755); err != nil {
		t.Fatal(err)
	}
	// Paced, so that the sibling is still filling when the daemon dies.
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, time.Second)
	cmd, result := e.restoreAtPreResume(t, images, work, script, marker)
	defer cmd.Process.Kill()
	b, err := os.ReadFile(filepath.Join(work, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	root, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	defer memProc{pid: root}.kill()
	d.cmd.Process.Signal(sig)
	killed := time.Now()
	select {
	case err := <-result:
		if err == nil {
			t.Fatalf("the restore succeeded although its daemon got %s", sig)
		}
		t.Logf("restore failed %s after the daemon got %s: %v", ms(time.Since(killed)), sig, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("CRIU did not return in 30 s after the daemon got %s and the tasks it restores were killed", sig)
	}
	for deadline := time.Now().Add(10 * time.Second); !gone(root); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the restored root %d is still there", root)
		}
	}
}

func killRound(t *testing.T, e *criuEnv, images, want string, siblings int, delay time.Duration, round int) []string {
	t.Helper()
	var socks, works []string
	for i := range siblings {
		w := filepath.Join(e.scratch, fmt.Sprintf("kill-%d-%d", round, i))
		os.MkdirAll(w, 0o755)
		works, socks = append(works, w), append(socks, filepath.Join(w, SocketName))
	}
	d := e.startDaemon(t, images, socks, 5*time.Millisecond)
	guard := childrenOf(d.cmd.Process.Pid)
	outcomes := make([]string, siblings)
	var survivors []memProc
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range siblings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sib, err := e.restore(images, works[i], true)
			if err != nil {
				outcomes[i] = "restore failed"
				return
			}
			req := "hash"
			if i == 0 {
				req = "forkhash"
			}
			got, err := sib.ask(req, 30*time.Second)
			switch {
			case errors.Is(err, errGone):
				outcomes[i] = "killed"
			case errors.Is(err, errCrashed):
				outcomes[i] = "CRASHED, WRONG MEMORY: " + err.Error()
			case err != nil:
				outcomes[i] = "ALIVE WITHOUT ANSWERING: " + err.Error()
				sib.kill()
			case got != want:
				outcomes[i] = fmt.Sprintf("WRONG MEMORY: hash %s, source %s", got, want)
				sib.kill()
			default:
				outcomes[i] = "complete"
				mu.Lock()
				survivors = append(survivors, sib)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(delay)
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	wg.Wait()
	for _, l := range d.find(EventFailed) {
		t.Logf("round %d: sibling %d failed before the kill: %s", round, l.Sibling, l.Error)
	}
	for _, o := range outcomes {
		if o != "complete" && o != "killed" && o != "restore failed" {
			t.Errorf("round %d: a sibling is %s", round, o)
		}
	}
	// A task of any restore, answered or not, that ran on wrong memory and
	// crashed wrote on its way out.
	for i, w := range works {
		if b, _ := os.ReadFile(filepath.Join(w, "stderr")); len(b) > 0 {
			t.Errorf("round %d: a task of sibling %d crashed (wrong memory): %s", round, i, b[:min(len(b), 2048)])
		}
	}
	for _, g := range guard {
		waitGone(t, g, "the daemon's guard")
	}
	alive := map[int]bool{}
	for _, s := range survivors {
		alive[s.pid] = true
	}
	for _, pid := range processesOf(filepath.Join(e.bin, "memfill")) {
		if !alive[pid] {
			t.Errorf("round %d: memfill pid %d is left over", round, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, s := range survivors {
		s.kill()
	}
	return outcomes
}

func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// processesOf lists the live processes running exe.
func processesOf(exe string) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if target, err := os.Readlink(d + "/exe"); err == nil && target == exe && !gone(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// TestCRIULazyRestoreTree restores a tree of three tasks (memfill and two
// children forked after its fill): one connection brings three
// userfaultfds, and each child's copy of the memory ends up equal to the
// source's.
func TestCRIULazyRestoreTree(t *testing.T) {
	const mib, children = 64, 2
	e := requireCRIU(t)
	images, want := e.dumpTree(t, mib, children)
	work := filepath.Join(e.scratch, "tree")
	os.MkdirAll(work, 0o755)
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, 0)
	root, err := e.restore(images, work, true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.kill()
	done := d.wait(t, EventComplete, 1, 60*time.Second)[0]
	if done.Socket != filepath.Join(work, SocketName) {
		t.Errorf("complete event names socket %q, want the sibling's %q", done.Socket, filepath.Join(work, SocketName))
	}
	if tasks := d.find(EventTask); len(tasks) != 1+children || done.Stats.Tasks != 1+children {
		t.Fatalf("daemon served %d tasks (%d in stats), want %d", len(tasks), done.Stats.Tasks, 1+children)
	}
	if got, err := root.ask("hash", 30*time.Second); err != nil || got != want {
		t.Fatalf("root: hash %q, %v; want %q", got, err, want)
	}
	kids := childrenOf(root.pid)
	if len(kids) != children {
		t.Fatalf("restored root has children %v, want %d", kids, children)
	}
	where, err := os.ReadFile(filepath.Join(root.dir, "source.where"))
	if err != nil {
		t.Fatal(err)
	}
	var addr, size int64
	if n, err := fmt.Sscanf(string(where), "%d %d", &addr, &size); n != 2 || size != mib<<20 {
		t.Fatalf("source.where = %q: %v", where, err)
	}
	for _, pid := range kids {
		if got := hashMem(t, pid, addr, size); got != want {
			t.Errorf("child %d: hash of its memory %s, source %s", pid, got, want)
		}
	}
}

// hashMem hashes another process's memory through /proc/PID/mem.
func hashMem(t testing.TB, pid int, addr, size int64) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := uint64(pattern.Seed)
	buf := make([]byte, 4<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		if _, err := f.ReadAt(buf[:n], addr+off); err != nil {
			t.Fatalf("read pid %d memory at %#x: %v", pid, addr+off, err)
		}
		for i := int64(0); i < n; i += 8 {
			h = pattern.Mix(h, binary.LittleEndian.Uint64(buf[i:]))
		}
	}
	return pattern.Format(h)
}

// TestCRIULazyDaemonClosedMidFill: a daemon told to stop (SIGTERM: Close)
// while a sibling fills kills the sibling first, and says it failed.
func TestCRIULazyDaemonClosedMidFill(t *testing.T) {
	e := requireCRIU(t)
	images, _ := e.dump(t, 256)
	work := filepath.Join(e.scratch, "closed")
	os.MkdirAll(work, 0o755)
	d := e.startDaemon(t, images, []string{filepath.Join(work, SocketName)}, 200*time.Millisecond)
	sib, err := e.restore(images, work, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sib.kill()
	if got, err := sib.ask("ping", 30*time.Second); err != nil || got != "pong" {
		t.Fatalf("ping: %q, %v", got, err)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	failed := d.wait(t, EventFailed, 1, 30*time.Second)[0]
	<-d.exited
	if !gone(sib.pid) {
		t.Fatalf("sibling %d still runs after the daemon closed (failed event: %q)", sib.pid, failed.Error)
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("lazypagesd exited %d after a failed sibling, want 1", code)
	}
	t.Logf("failed event: %s", failed.Error)
}
