package integration

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"golang.org/x/sys/unix"
)

// tclone's build of CRIU reads its tasks' smaps ahead of their dumps
// (--smaps-read-ahead): the capture's log says so for every process of
// the tree, and no read-ahead was thrown away (the frozen tree's
// mappings did not change between the read and the dump). Its twin
// plugin makes the twins of the whole tree side by side, in one batch.
func TestCaptureReadsAheadAndTwinsSideBySide(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "smaps")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", "sleep 100000 & sleep 100000 & touch /ready; wait")
	eventually(t, 30*time.Second, "the source's processes started", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})

	log := planDumpLog(t, src, "copy")
	// sh and its two sleeps.
	if want := "smaps-ahead: Reading the smaps of 3 tasks ahead"; !strings.Contains(string(log), want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	if strings.Contains(string(log), "smaps were read ahead: read again") {
		t.Errorf("the capture read a frozen task's smaps again:\n%s", log)
	}

	log = planDumpLog(t, src, "twin")
	if want := "tclone twin: 3 twins of 3 processes side by side"; !strings.Contains(string(log), want) {
		t.Errorf("the twin capture's CRIU log does not say %q:\n%s", want, log)
	}
}

// planDumpLog makes a plan of src with --memory memory (and extra
// options) and returns its CRIU dump log, at debug level (a capture's CRIU
// logs only warnings and errors otherwise); the plan goes at the test's
// end.
func planDumpLog(t *testing.T, src, memory string, extra ...string) []byte {
	t.Helper()
	args := append([]string{"--log-level", "debug", "fork", "--plan-only", "--memory", memory}, extra...)
	r := run(t, time.Minute, tcloneBin(), append(args, containerID(t, src))...)
	if r.code != 0 {
		t.Fatalf("plan-only --memory %s: %s", memory, r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// tclone's build of CRIU dumps a directory that several processes work in
// once, under one id (file-ids-dirs.patch), where stock CRIU dumps every
// process's cwd and root again: processes in distinct directories, two of
// them sharing one, and one in a bind mount's directory named like one of
// the image's (/srv/tmp and /tmp), each keep their own in the sibling,
// with copied memory and with twins. The capture's images hold each
// directory once.
func TestForkKeepsEveryWorkingDirectory(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "cwd")
	vol := t.TempDir()
	if err := os.Mkdir(filepath.Join(vol, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	// "/srv/tmp" is a directory of the bind mount; "/tmp" is the image's.
	script := "mkdir -p /w/a /w/b; " +
		"(cd /w/a && exec sleep 100001) & (cd /w/b && exec sleep 100002) & (cd /w/b && exec sleep 100003) & " +
		"(cd /srv/tmp && exec sleep 100004) & (cd /tmp && exec sleep 100005) & " +
		"touch /ready; cd /w; wait"
	podman(t, "run", "-d", "--name", src, "-v", vol+":/srv", busybox, "sh", "-c", script)
	eventually(t, 30*time.Second, "the source's processes started", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})
	cwds := func(c string) string {
		t.Helper()
		// Each sleep's argument and its cwd, and the shell's.
		return podman(t, "exec", c, "sh", "-c",
			`for p in /proc/[0-9]*; do a=$(tr '\0' ' ' <$p/cmdline); case "$a" in sleep*) echo "$a: $(readlink $p/cwd) $(readlink $p/root)";; "sh -c mkdir"*) echo "the shell: $(readlink $p/cwd) $(readlink $p/root)";; esac; done | sort`)
	}
	want := cwds(src)
	for _, w := range []string{"sleep 100001 : /w/a /", "sleep 100003 : /w/b /", "sleep 100004 : /srv/tmp /", "sleep 100005 : /tmp /", "the shell: /w /"} {
		if !strings.Contains(want, w) {
			t.Fatalf("the source is not as the test made it: no %q in\n%s", w, want)
		}
	}
	// One file entry for each directory, whoever works in it: the shell's
	// and the sleeps' root (/), /w/b of two sleeps.
	names := map[string]int{}
	for _, f := range planFiles(t, src) {
		if r := f.GetReg(); r != nil {
			names[r.GetName()]++
		}
	}
	for _, dir := range []string{"/", "/w", "/w/a", "/w/b", "/srv/tmp", "/tmp"} {
		if names[dir] != 1 {
			t.Errorf("the capture's images hold %d entries of %s, want 1 (all: %v)", names[dir], dir, names)
		}
	}
	for _, memory := range []string{"copy", "twin"} {
		sib := src + "-" + memory
		t.Cleanup(func() { podmanTry(t, "rm", "-f", sib) })
		if r := forkCLI(t, "--memory", memory, "--name", sib, src); r.code != 0 {
			t.Fatalf("fork --memory %s: exit %d: %s", memory, r.code, r.stderr)
		}
		if got := cwds(sib); got != want {
			t.Errorf("--memory %s: the sibling's processes work in\n%s\nwant\n%s", memory, got, want)
		}
	}
}

// planFiles makes a plan of src and returns the entries of its files.img.
func planFiles(t *testing.T, src string) []*fdinfo.FileEntry {
	t.Helper()
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	in, err := os.Open(filepath.Join(planDir, "images", "files.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(&fdinfo.FileEntry{})
	if err != nil {
		t.Fatalf("decoding the plan's files.img: %v", err)
	}
	var files []*fdinfo.FileEntry
	for _, e := range img.Entries {
		files = append(files, e.Message.(*fdinfo.FileEntry))
	}
	return files
}

// tclone's build of CRIU closes a parasite's control socket and log, its
// last calls before the sigreturn, with one close_range() where the two
// are neighbours and with two close() calls where the task holds the slot
// between (compel-fini-calls.patch). Either way a capture leaves every
// process of the source with exactly the descriptors it had: here a
// process holding 0-2 only (neighbours) and one also holding 4 and 6
// (apart), through a twin and a copy capture. Where CRIU steps the
// parasite to its sigreturn (no hardware breakpoints), the log shows which
// way each process went.
func TestCaptureLeavesTheSourcesDescriptors(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "fds")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", "sleep 100000 </dev/null & exec sleep 100000 4</dev/null 6</dev/null")
	pid, err := strconv.Atoi(podman(t, "inspect", "--format", "{{.State.Pid}}", src))
	if err != nil {
		t.Fatal(err)
	}
	var child int
	eventually(t, 30*time.Second, "the source's two sleeps", func() error {
		tree := processTreeOf(pid)
		if len(tree) != 2 || !strings.HasSuffix(descriptorsOf(pid)["6"], "/dev/null") {
			return errorf("processes %v", tree)
		}
		child = tree[1]
		return nil
	})
	before := map[int]map[string]string{pid: descriptorsOf(pid), child: descriptorsOf(child)}
	for _, fd := range []string{"3", "5"} {
		if _, ok := before[pid][fd]; ok {
			t.Fatalf("process %d holds descriptor %s, which the test needs free: %v", pid, fd, before[pid])
		}
	}
	for _, memory := range []string{"twin", "copy"} {
		log := string(planDumpLog(t, src, memory))
		for p, want := range before {
			if got := descriptorsOf(p); !maps.Equal(got, want) {
				t.Errorf("--memory %s: process %d holds %v after the capture, %v before", memory, p, got, want)
			}
		}
		if !strings.Contains(log, fmt.Sprintf("%d (native) is going to execute the syscall", pid)) {
			t.Logf("--memory %s: CRIU did not step the parasites to their sigreturn (it has hardware breakpoints here)", memory)
			continue
		}
		for p, want := range map[int]string{pid: "close", child: "close_range"} {
			var calls []string
			for call, nr := range map[string]int{"close": unix.SYS_CLOSE, "close_range": unix.SYS_CLOSE_RANGE} {
				if strings.Contains(log, fmt.Sprintf("%d (native) is going to execute the syscall %d,", p, nr)) {
					calls = append(calls, call)
				}
			}
			if len(calls) != 1 || calls[0] != want {
				t.Errorf("--memory %s: process %d's parasite closed its descriptors with %v, want %s only", memory, p, calls, want)
			}
		}
	}
}

// descriptorsOf gives process pid's descriptors, each with what it names.
func descriptorsOf(pid int) map[string]string {
	out := map[string]string{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
			out[fd.Name()] = l
		}
	}
	return out
}

// A CRIU killed while a process of the source is inside one of the system
// calls CRIU injects into it (its parasite's memfd, the memfd's mapping,
// the memfd's close, the mapping's removal), or while a thread of it other
// than its first runs a parasite command, leaves the process running its
// own code, every thread of it, with none of those left in it. CRIU's own
// calls and commands end at an int3, which an untraced thread takes as
// SIGTRAP, and its process dies: a fault suite round found a source whose
// init died so, and its container with it. tclone's CRIU runs those calls
// at code in the process's vDSO, and ends those commands, with a stop the
// thread takes back to its own code by itself
// (criuhooks/criu/compel-safe-calls.patch); the next captures write over
// what the killed ones left in the vDSO. The workload is a Go program: it
// has several threads, and handles SIGURG, the signal those stops use.
func TestCaptureSurvivesCRIUKilledInAnInjectedCall(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	n, pid := workloadOf(t, 16)
	threads, fds, blobs := threadsOf(pid), descriptorsOf(pid), parasiteMappings(t, pid)
	if len(threads[pid]) < 2 {
		t.Fatalf("the workload has threads %v: the test needs more than one", threads[pid])
	}
	for round, c := range []struct {
		point, memory string
	}{
		{fmt.Sprintf("call-%d", unix.SYS_MEMFD_CREATE), "copy"},
		{fmt.Sprintf("call-%d", unix.SYS_MMAP), "copy"},
		{"thread", "copy"},
		{fmt.Sprintf("call-%d", unix.SYS_CLOSE), "twin"},
		{fmt.Sprintf("call-%d", unix.SYS_MUNMAP), "copy"},
		{fmt.Sprintf("call-%d", unix.SYS_MMAP), "twin"},
		{"thread", "twin"},
	} {
		what := fmt.Sprintf("round %d (--memory %s, CRIU killed at %s)", round, c.memory, c.point)
		t.Setenv("TCLONE_COMPEL_TEST_STALL", c.point+":20000")
		cmd, criu := startCaptureStalledAt(t, n, pid, c.memory, "test stall at "+c.point+" for")
		syscall.Kill(criu, syscall.SIGKILL)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		os.Unsetenv("TCLONE_COMPEL_TEST_STALL")
		requireUntraced(t, pid, releaseWait)
		t.Logf("%s: CRIU killed", what)
		requireSourceRuns(t, n)
		requireThreadsLive(t, what, pid, threads)
		if got := descriptorsOf(pid); !maps.Equal(got, fds) {
			t.Fatalf("%s: the source holds descriptors %v, %v before", what, got, fds)
		}
		// Killed in an injected call, CRIU leaves no parasite mapped; killed
		// while the parasite runs in a process of several threads (as it
		// does while a thread runs a command), it leaves the parasite's
		// blob mapped, as ever.
		after := parasiteMappings(t, pid)
		if after > blobs && c.point != "thread" {
			t.Fatalf("%s: the parasite's memfd is still mapped in the source (%d mappings of it, %d before)", what, after, blobs)
		}
		blobs = after
		// A twin of the killed capture dies with CRIU; the recovery reaps it.
		if r := run(t, time.Minute, tcloneBin(), "gc"); r.code != 0 {
			t.Fatalf("%s: tclone gc: %s", what, r.stderr)
		}
		eventually(t, 10*time.Second, "no twin left in the source", func() error {
			if tw := twinsUnder(pid); len(tw) > 0 {
				return fmt.Errorf("%s: twins in the source after tclone gc: %v", what, tw)
			}
			return nil
		})
	}
	// What the last killed CRIU left in the vDSO is written over.
	for _, memory := range []string{"copy", "twin"} {
		log := string(planDumpLog(t, n, memory, "--file-locks"))
		for _, want := range []string{"injected calls run at", "its command runs kill-safe"} {
			if !strings.Contains(log, want) {
				t.Errorf("--memory %s: the capture after the killed ones does not log %q:\n%s", memory, want, log)
			}
		}
	}
	requireSourceRuns(t, n)
}

// The signal the kill-safe calls stop with (SIGURG here: a Go program's
// preemption signal, which it never blocks) may also come from someone
// else while CRIU injects a call. It reaches the process as it would have,
// and the captures work: here another process sends the source SIGURG
// without a pause through three captures.
func TestCaptureUnderAFloodOfItsStopSignal(t *testing.T) {
	requireStack(t)
	n, pid := workloadOf(t, 16)
	stop, sent := make(chan struct{}), make(chan int, 1)
	// However the test ends, the flood ends with it.
	stopFlood := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(stopFlood)
	go func() {
		count := 0
		defer func() { sent <- count }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if syscall.Kill(pid, syscall.SIGURG) == nil {
				count++
			}
		}
	}()
	passed := 0
	for range 3 {
		log := string(planDumpLog(t, n, "copy", "--file-locks"))
		if !strings.Contains(log, "kill-safe, stopping with signal 23") {
			t.Errorf("the capture did not run its injected calls kill-safe with SIGURG:\n%s", log)
		}
		passed += strings.Count(log, "passing on a signal 23 of someone else's")
	}
	stopFlood()
	t.Logf("%d SIGURGs sent; the captures passed %d on to the process", <-sent, passed)
	if passed == 0 {
		t.Errorf("no SIGURG of the flood came while CRIU injected a call: the test did not test passing one on")
	}
	requireSourceRuns(t, n)
}

// parasiteMappings counts the mappings of CRIU's parasite memfd in process
// pid.
func parasiteMappings(t *testing.T, pid int) int {
	t.Helper()
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(m), "CRIUMFD")
}

// A CRIU killed while its parasite's daemon runs in a process of one
// thread (here a busybox shell, its tree's first) leaves the process
// running with no trace of the parasite: the daemon returns by itself
// through the kill-safe code, which unmaps the parasite's blob. It used to
// stay mapped, and every later fork carried it into its siblings.
func TestCaptureKilledWhileItsParasiteRunsLeavesNoParasite(t *testing.T) {
	requireStack(t)
	n := name(t, "daemon")
	podman(t, "run", "-d", "--name", n, busybox, "sh", "-c", "sleep 100000 & while :; do sleep 0.1; done")
	pid := containerPid(t, n)
	fds := descriptorsOf(pid)
	t.Setenv("TCLONE_COMPEL_TEST_STALL", "daemon:20000")
	cmd, criu := startCaptureStalledAt(t, n, pid, "copy", "test stall at daemon for")
	syscall.Kill(criu, syscall.SIGKILL)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	os.Unsetenv("TCLONE_COMPEL_TEST_STALL")
	requireUntraced(t, pid, releaseWait)
	eventually(t, 10*time.Second, "the parasite gone from the source", func() error {
		if m := parasiteMappings(t, pid); m > 0 {
			return fmt.Errorf("%d mappings of the parasite's memfd in process %d", m, pid)
		}
		return nil
	})
	if got := descriptorsOf(pid); !maps.Equal(got, fds) {
		t.Fatalf("the source holds descriptors %v, %v before", got, fds)
	}
	if r := run(t, time.Minute, tcloneBin(), "gc"); r.code != 0 {
		t.Fatalf("tclone gc: %s", r.stderr)
	}
	// It runs on: its loop starts new sleeps, and it can be captured again.
	before := processTreeOf(pid)
	eventually(t, 10*time.Second, "the source's loop running on", func() error {
		if now := processTreeOf(pid); slices.Equal(now, before) {
			return fmt.Errorf("the source's processes are still %v", now)
		}
		return nil
	})
	planDumpLog(t, n, "copy")
	if st := state(t, n); st != "running" {
		t.Fatalf("the source is %s", st)
	}
}
