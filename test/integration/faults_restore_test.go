package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// startService starts a Podman service of this test's own, with env added
// to its environment (the service passes its own environment, not its
// clients', to the runtime), and returns its socket. It is stopped when the
// test ends.
func startService(t *testing.T, env ...string) string {
	t.Helper()
	noInheritedFiles(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "podman.sock")
	logFile, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/podman", "--runtime", "tclone", "system", "service", "--time=0", "unix://"+sock)
	cmd.Env = append(append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1"), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The service dies with this process even if a hung test is killed
	// before its cleanups run. The parent-death signal belongs to the
	// thread that started the child, so that thread is kept for good.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		started <- cmd.Start()
		select {}
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("service log:\n%s", lastLines(string(log), 30))
		}
	})
	eventually(t, 20*time.Second, "Podman service answering", func() error {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return err
		}
		c.Close()
		return nil
	})
	return sock
}

// noInheritedFiles keeps the descriptors this process inherited (the
// stack lock's, from flock) from passing to the processes it starts: a
// Podman service or a conmon that outlives a failed test would hold the
// lock for everyone.
func noInheritedFiles(t *testing.T) {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Logf("marking inherited descriptors close-on-exec: %v", err)
	}
}

// runWithin runs a command with env added, giving up at limit: a hung
// Podman must fail the test, not hang it (descendants that keep its output
// open are not waited for either).
func runWithin(limit time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1"), env...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("%s %s: no answer within %s", name, strings.Join(args, " "), limit)
	}
	return string(out), err
}

// psWithin runs `podman ps -a`, giving up at limit.
func psWithin(t *testing.T, limit time.Duration) error {
	t.Helper()
	out, err := runWithin(limit, nil, "/usr/bin/podman", "ps", "-a", "--format", "{{.Names}} {{.Status}}")
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// procArgs returns the argv of every process whose argv satisfies match.
func procArgs(match func([]string) bool) map[int][]string {
	out := map[int][]string{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if match(argv) {
			out[pid] = argv
		}
	}
	return out
}

// isTcloneRestore matches the `tclone restore` conmon runs for a sibling.
func isTcloneRestore(argv []string) bool {
	return len(argv) > 2 && filepath.Base(argv[0]) == "tclone" && contains(argv, "restore") && contains(argv, "--image-path")
}

// restoreDiedID finds the sibling of a restore that died in podman-fork's
// error.
var restoreDiedID = regexp.MustCompile(`tclone restore of ([0-9a-f]{64}) died`)

func isRestoreWatchdog(argv []string) bool {
	return len(argv) > 1 && argv[1] == fork.RestoreWatchCommand
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A `tclone restore` killed the moment crun has restored the sibling (the
// crash point sibling-restored), once the sibling is complete but before
// tclone exits 0 (before-report: conmon sees its runtime fail all the
// same), or after it ended its journal entry and before it released its
// watchdog (entry-ended: the watchdog undoes from the record it was
// handed), leaves Podman responsive: its watchdog removes the sibling, conmon
// reads end-of-file on the runtime's stderr and reports the failure, and
// Podman lets go of the container's lock. The fork fails, the source runs
// on, and nothing is left.
func TestKilledRestoreLeavesPodmanResponsive(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	for _, point := range []string{fork.CrashSiblingRestored, fork.CrashBeforeReport, fork.CrashEntryEnded} {
		t.Run(point, func(t *testing.T) {
			sock := startService(t, fork.EnvCrashAt+"="+point)
			for _, tty := range []bool{false, true} {
				t.Run(fmt.Sprintf("tty=%v", tty), func(t *testing.T) { killedRestore(t, sock, tty) })
			}
		})
	}
}

func killedRestore(t *testing.T, sock string, tty bool) {
	src := name(t, "kr")
	args := []string{"run", "-d", "--name", src}
	if tty {
		args = append(args, "-t")
	}
	podman(t, append(args, busybox, "sh", "-c", counterScript)...)
	readCounter(t, src)
	sib := src + "-f"
	t.Cleanup(func() { podmanTry(t, "rm", "-f", "-t", "0", sib) })

	cmd := exec.Command(podmanForkBin(), "--url", "unix://"+sock, "--name", sib, src)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	forkDone := make(chan error, 1)
	go func() { forkDone <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	// The restore conmon runs, and its death. It can be short: looked for
	// every few milliseconds, and if it came and went unseen all the same,
	// its sibling is the one podman-fork's error names.
	pid, sibID := 0, ""
	var forkErr error
	forkEnded := false
	for deadline := time.Now().Add(time.Minute); pid == 0 && !forkEnded; {
		for p, argv := range procArgs(isTcloneRestore) {
			pid, sibID = p, argv[len(argv)-1]
		}
		select {
		case forkErr = <-forkDone:
			forkEnded = true
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("tclone restore not started within 1m0s")
		}
	}
	if pid != 0 {
		eventually(t, 60*time.Second, "tclone restore killed", func() error {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return fmt.Errorf("pid %d still runs", pid)
			}
			return nil
		})
		died := time.Now()
		if err := psWithin(t, answerWait); err != nil {
			t.Fatalf("podman ps -a after the restore died: %v", err)
		}
		t.Logf("podman ps -a answered %s after tclone restore died", time.Since(died).Round(time.Millisecond))
	}
	if !forkEnded {
		select {
		case forkErr = <-forkDone:
		case <-time.After(2 * time.Minute):
			t.Fatalf("podman-fork still waits 2 minutes after its restore died: %s", stderr.String())
		}
	}
	if forkErr == nil {
		t.Fatal("a fork whose restore was killed succeeded")
	}
	t.Logf("podman-fork: %s", strings.TrimSpace(stderr.String()))
	if pid == 0 {
		// Unseen: the error names the restore that died.
		m := restoreDiedID.FindStringSubmatch(stderr.String())
		if m == nil {
			t.Fatalf("tclone restore was never seen, and podman-fork's error names no restore that died: %s", stderr.String())
		}
		sibID = m[1]
		if err := psWithin(t, answerWait); err != nil {
			t.Fatalf("podman ps -a after the fork failed: %v", err)
		}
		t.Logf("tclone restore of %s came and went between two looks; podman-fork named it", sibID)
	}

	// What Podman reports of the sibling: gone (the fork rolled it back),
	// or failed and removable.
	if st := podmanTry(t, "inspect", "--format", "{{.State.Status}}", sib); st.code == 0 {
		t.Logf("Podman still has %s, state %q", sib, strings.TrimSpace(st.stdout))
		if rm := podmanTry(t, "rm", "-f", "-t", "0", sib); rm.code != 0 {
			t.Fatalf("the failed sibling cannot be removed: %s", rm.stderr)
		}
	} else {
		t.Logf("Podman no longer has %s", sib)
	}
	a := readCounter(t, src)
	time.Sleep(500 * time.Millisecond)
	if b := readCounter(t, src); b <= a || state(t, src) != "running" {
		t.Fatalf("the source does not run on: counter %d then %d", a, b)
	}
	requireSiblingGone(t, sibID)
	requireNoLeftovers(t)
}

// Without a fork client to roll it back (a plain `podman container restore
// --import` of a fork checkpoint, run by the podman CLI), a restore killed
// the same way fails at once, Podman stays responsive, and the container
// Podman made is left in a state it can remove.
func TestKilledRestoreWithoutClient(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	noInheritedFiles(t)
	src := name(t, "krc")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)
	sib := name(t, "krc-sib")

	// A fork checkpoint, asked for the way podman-fork asks.
	store := hostStore
	srcID := containerID(t, src)
	unlock, err := store.LockIntents(srcID)
	if err != nil {
		t.Fatal(err)
	}
	store.WriteIntent(plan.Intent{ContainerID: srcID, Nonce: sib, Fork: forkopts.Fork{Uses: 1, TTL: 2 * time.Minute, Identity: forkopts.IdentityUnique}})
	archive := filepath.Join(t.TempDir(), "checkpoint.tar")
	podman(t, "container", "checkpoint", "--leave-running", "--ignore-rootfs", "--export", archive, src)
	unlock()
	_, plans := clientFiles(t, os.Getpid())
	if len(plans) != 1 {
		t.Fatalf("plans held for this test: %v, want one", plans)
	}
	t.Cleanup(func() { store.Remove(store.Dir(plans[0])) })

	start := time.Now()
	out, err := runWithin(time.Minute, []string{fork.EnvCrashAt + "=" + fork.CrashSiblingRestored},
		"/usr/bin/podman", "container", "restore", "--import", archive, "--ignore-rootfs", "--name", sib)
	if err == nil {
		t.Fatalf("a restore whose tclone was killed succeeded: %s", out)
	}
	t.Logf("podman container restore failed after %s: %s", time.Since(start).Round(time.Millisecond), lastLines(out, 3))
	if !strings.Contains(out, "half-made sibling was removed") {
		t.Errorf("the restore's error does not say what happened: %s", out)
	}
	if err := psWithin(t, answerWait); err != nil {
		t.Fatalf("podman ps -a after the killed restore: %v", err)
	}
	st, err := runWithin(30*time.Second, nil, "/usr/bin/podman", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.State.Error}}", sib)
	if err != nil {
		t.Fatalf("Podman lost the container it made: %v %s", err, st)
	}
	t.Logf("Podman's state of the failed container: %s", strings.TrimSpace(st))
	if state := strings.Fields(st)[0]; state != "created" && state != "exited" && state != "stopped" && state != "configured" {
		t.Errorf("the failed container is %q, neither created, exited nor stopped", state)
	}
	if out, err := runWithin(30*time.Second, nil, "/usr/bin/podman", "rm", sib); err != nil {
		t.Fatalf("removing the failed container: %v: %s", err, out)
	}
	if _, err := os.Stat(store.Dir(plans[0])); err != nil {
		t.Fatalf("the killed restore's use was not given back (plan gone): %v", err)
	}
	if u, _ := plan.ReadUses(store.Dir(plans[0])); u.Remaining != 1 || len(u.InFlight) != 0 {
		t.Fatalf("uses after the killed restore: %+v, want its use given back", u)
	}
	store.Remove(store.Dir(plans[0]))
	if a, b := readCounter(t, src), readCounter(t, src); state(t, src) != "running" || a == 0 || b < a {
		t.Fatalf("the source does not run on")
	}
	requireNoLeftovers(t)
}

// requireSiblingGone checks that nothing of a Podman sibling that was
// undone is left: no crun state, no cgroup, no conmon, no watchdog.
func requireSiblingGone(t *testing.T, id string) {
	t.Helper()
	eventually(t, 10*time.Second, "sibling "+id+" gone", func() error {
		if st := crunState(t, id); st != "" {
			return fmt.Errorf("crun still knows it (%s)", st)
		}
		if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/libpod_parent/libpod-" + id + "*"); len(cgs) > 0 {
			return fmt.Errorf("cgroups left: %v", cgs)
		}
		conmons := procArgs(func(argv []string) bool {
			return len(argv) > 0 && filepath.Base(argv[0]) == "conmon" && contains(argv, id)
		})
		if len(conmons) > 0 {
			return fmt.Errorf("conmon still runs: %v", conmons)
		}
		if w := procArgs(isRestoreWatchdog); len(w) > 0 {
			return fmt.Errorf("restore watchdogs still run: %v", w)
		}
		return nil
	})
}

// gcResult is `tclone gc`'s report: the runtime's recovery and the fork
// calls of dead clients.
type gcResult struct {
	fork.Recovered
	Calls calls.Report `json:"fork_calls"`
}

// gcReport runs `tclone gc` and decodes its report.
func gcReport(t *testing.T) gcResult {
	t.Helper()
	r := run(t, time.Minute, tcloneBin(), "gc")
	if r.code != 0 {
		t.Fatalf("tclone gc: exit %d: %s", r.code, r.stderr)
	}
	var rep gcResult
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("tclone gc printed %q: %v", r.stdout, err)
	}
	return rep
}

// clientFiles finds what a fork client holds on the host: its archive
// directory and the plans held for it.
func clientFiles(t *testing.T, pid int) (dirs, plans []string) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(hostStore.TempDir(), "tclone-fork-*"))
	for _, d := range matches {
		data, _ := os.ReadFile(filepath.Join(d, calls.OwnerFile))
		var o calls.DirOwner
		if json.Unmarshal(data, &o) == nil && o.Owner.Pid == pid {
			dirs = append(dirs, d)
		}
	}
	store := hostStore
	ids, _ := store.List()
	for _, id := range ids {
		u, err := plan.ReadUses(store.Dir(id))
		if err == nil && u.Client != nil && u.Client.Pid == pid {
			plans = append(plans, id)
		}
	}
	return dirs, plans
}

// startForkInHook starts a two-sibling fork whose hook keeps it busy, one
// sibling at a time, and waits until the first sibling exists: the plan
// then holds one unused use for the client.
func startForkInHook(t *testing.T, src string) (*exec.Cmd, chan error) {
	t.Helper()
	cmd := exec.Command(podmanForkBin(), "--count", "2", "--parallel", "1", "--hook", "sleep 6", src)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	eventually(t, 90*time.Second, "first sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	return cmd, done
}

// gc leaves a live fork client's plan and temporary directory alone (the
// fork then finishes), and collects those of a client killed mid-fork at
// once, with the lock files no one holds; it keeps a held lock file and a
// directory whose owner runs.
func TestGCCollectsOnlyWhatDeadClientsLeft(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	noInheritedFiles(t)
	src := name(t, "gc")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", counterScript)
	readCounter(t, src)

	// A live client.
	cmd, done := startForkInHook(t, src)
	dirs, plans := clientFiles(t, cmd.Process.Pid)
	if len(dirs) != 1 || len(plans) != 1 {
		t.Fatalf("a fork client in flight holds temp dirs %v and plans %v; want one of each", dirs, plans)
	}
	rep := gcReport(t)
	if again, againPlans := clientFiles(t, cmd.Process.Pid); len(again) != 1 || len(againPlans) != 1 {
		t.Fatalf("gc took a live client's files: report %+v", rep)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the fork failed after gc ran beside it: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the fork did not finish")
	}
	if n := len(siblingsOf(t, src)); n != 2 {
		t.Fatalf("%d siblings, want 2", n)
	}
	removeContainers(t, src+"-fork-1", src+"-fork-2")

	// A client killed mid-fork.
	cmd, done = startForkInHook(t, src)
	dirs, plans = clientFiles(t, cmd.Process.Pid)
	if len(dirs) != 1 || len(plans) != 1 {
		t.Fatalf("a fork client in flight holds temp dirs %v and plans %v; want one of each", dirs, plans)
	}
	cmd.Process.Kill()
	<-done

	// A lock someone holds, and directories of a live and a dead owner.
	held := filepath.Join(hostStore.LocksDir(), "tct-held-"+src+".lock")
	holder := exec.Command("flock", "-x", held, "sleep", "600")
	// flock runs sleep as its child, holding the lock too: the group goes.
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); holder.Wait(); os.Remove(held) })
	liveDir, deadDir := ownedDir(t, true), ownedDir(t, false)
	eventually(t, 5*time.Second, "lock held", func() error { _, err := os.Stat(held); return err })

	rep = gcReport(t)
	t.Logf("gc report: %+v", rep)
	if !reported(rep.Calls.TempDirs, dirs[0]) || !reported(rep.Calls.TempDirs, deadDir) || reported(rep.Calls.TempDirs, liveDir) {
		t.Errorf("temp dirs removed %v; want %s and %s, not %s", rep.Calls.TempDirs, dirs[0], deadDir, liveDir)
	}
	found := false
	for _, p := range rep.Plans {
		found = found || (p.ID == plans[0] && p.Reason == plan.SweptClientGone)
	}
	if !found {
		t.Errorf("plan %s of the dead client not reported removed as %s: %+v", plans[0], plan.SweptClientGone, rep.Plans)
	}
	srcID := containerID(t, src)
	for _, l := range []string{srcID + ".lock", "intent-" + srcID + ".lock"} {
		if !reported(rep.Locks, filepath.Join(hostStore.LocksDir(), l)) {
			t.Errorf("lock %s not collected: %v", l, rep.Locks)
		}
	}
	if reported(rep.Locks, held) {
		t.Errorf("a held lock was collected")
	}
	for path, want := range map[string]bool{dirs[0]: false, deadDir: false, liveDir: true, held: true, hostStore.Dir(plans[0]): false} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", path, err == nil, want)
		}
	}
	requireNoLeftovers(t)
	// The source can still be forked: the locks are made anew.
	if r := forkCLI(t, "--name", src+"-after", src); r.code != 0 {
		t.Fatalf("fork after gc: %s", r.stderr)
	}
	removeContainers(t, src+"-after")
}

func reported(list []string, s string) bool { return contains(list, s) }

// ownedDir makes a podman-fork temporary directory owned by a process that
// runs on, or one that was killed.
func ownedDir(t *testing.T, live bool) string {
	t.Helper()
	owner := exec.Command("sleep", "600")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	o, ok := journal.OwnerOf(owner.Process.Pid)
	if !ok {
		t.Fatal("the owner process is gone")
	}
	// The collector looks only in the store's temp root, and only at a
	// directory whose name carries the prefix and a maker's PID.
	root := hostStore.TempDir()
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, fmt.Sprintf("podman-fork-%d-tct-", owner.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rec := fmt.Sprintf(`{"owner":{"pid":%d,"start_time":%d}}`, o.Pid, o.StartTime)
	if err := os.WriteFile(filepath.Join(dir, calls.OwnerFile), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	if live {
		t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	} else {
		owner.Process.Kill()
		owner.Wait()
	}
	return dir
}

// A kill of the whole cgroup of the tclone that restores a sibling (what a
// service manager stopping Podman, or an OOM kill of the group, does) does
// not take the restore's watchdog along: it lives in tclone's own cgroup,
// and removes the half-made sibling at once, without any gc.
func TestRestoreWatchdogSurvivesCallerCgroupKill(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	noInheritedFiles(t)
	src := newBundle(t, "src", true, "sh", "-c", counterScript)
	src.start(t)
	src.counter(t)
	sib := newBundle(t, "sib", false)
	sib.spec.Process.Args = src.spec.Process.Args
	sib.save(t)
	caller := callerCgroup(t)

	dir := t.TempDir()
	stderrPath := filepath.Join(dir, "stderr")
	stdout, _ := os.Create(filepath.Join(dir, "stdout"))
	stderr, _ := os.Create(stderrPath)
	defer stdout.Close()
	defer stderr.Close()
	cmd := exec.Command("sh", "-c", caller.enter()+"exec "+tcloneBin()+` "$@"`, "sh", "fork", "--bundle", sib.dir, src.id, sib.id)
	cmd.Env = append(os.Environ(), fork.EnvPauseAt+"="+fork.CrashSiblingRestored)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	eventually(t, 2*time.Minute, "tclone paused with the sibling restored", func() error {
		data, _ := os.ReadFile(stderrPath)
		if !strings.Contains(string(data), fork.PausedMessage) {
			return fmt.Errorf("stderr so far: %q", data)
		}
		return nil
	})
	if st := crunState(t, sib.id); st != "running" {
		t.Fatalf("the sibling is %q at the pause, not running", st)
	}
	caller.killAll(t)
	<-done

	// No gc: the watchdog alone undoes the sibling.
	eventually(t, 15*time.Second, "the half-made sibling removed", func() error {
		if st := crunState(t, sib.id); st != "" {
			return fmt.Errorf("crun still has it (%s)", st)
		}
		if l := leftovers(); len(l) > 0 {
			return fmt.Errorf("left: %v", l)
		}
		return nil
	})
	if entries, _ := os.ReadDir(sib.rootfs()); len(entries) != 0 {
		t.Errorf("the sibling's root still holds %d entries", len(entries))
	}
	data, _ := os.ReadFile(stderrPath)
	if !strings.Contains(string(data), "the half-made sibling was removed") {
		t.Errorf("the caller was not told: %q", data)
	}
	requireRunning(t, src)
}

// testCgroup is a cgroup the test runs a process in, in each hierarchy
// through which a whole group is killed.
type testCgroup struct{ dirs []string }

func callerCgroup(t *testing.T) *testCgroup {
	t.Helper()
	rel := filepath.Join("tclone-test", fmt.Sprintf("tct-caller-%d", time.Now().UnixNano()))
	var c testCgroup
	if cgroupsUnified() {
		c.dirs = []string{filepath.Join("/sys/fs/cgroup", rel)}
	} else {
		for _, h := range []string{"freezer", "pids", "systemd"} {
			c.dirs = append(c.dirs, filepath.Join("/sys/fs/cgroup", h, rel))
		}
	}
	for _, d := range c.dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range c.dirs {
			os.Remove(d)
		}
	})
	return &c
}

func cgroupsUnified() bool {
	var fs unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC
}

// enter is shell that moves the shell into the cgroup.
func (c *testCgroup) enter() string {
	var b strings.Builder
	for _, d := range c.dirs {
		fmt.Fprintf(&b, "echo $$ > %s/cgroup.procs && ", d)
	}
	return b.String()
}

// killAll kills every process of the cgroup the way a service manager
// does: on v1, freeze it so nothing escapes by forking, kill all, thaw.
func (c *testCgroup) killAll(t *testing.T) {
	t.Helper()
	if cgroupsUnified() {
		if err := os.WriteFile(filepath.Join(c.dirs[0], "cgroup.kill"), []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		return
	}
	freezer := c.dirs[0]
	state := filepath.Join(freezer, "freezer.state")
	os.WriteFile(state, []byte("FROZEN"), 0)
	eventually(t, 10*time.Second, "caller cgroup frozen", func() error {
		data, _ := os.ReadFile(state)
		if strings.TrimSpace(string(data)) != "FROZEN" {
			return fmt.Errorf("%s", data)
		}
		return nil
	})
	data, _ := os.ReadFile(filepath.Join(freezer, "cgroup.procs"))
	pids := strings.Fields(string(data))
	for _, p := range pids {
		if pid, err := strconv.Atoi(p); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.WriteFile(state, []byte("THAWED"), 0)
	t.Logf("killed the caller cgroup's processes %v", pids)
}
