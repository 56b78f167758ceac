package procfs

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statLine is a /proc/PID/stat line of a process named comm, in state S,
// with the given parent, start time and exit signal.
func statLine(comm, ppid, start, exitSignal string) string {
	f := make([]string, 50)
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[19], f[35] = "S", ppid, start, exitSignal
	return "1234 (" + comm + ") " + strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses.
	st, err := ParseStat(statLine("a) b (c)", "1", "98765", "17"))
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stat{Comm: "a) b (c)", State: 'S', PPid: 1, StartTime: 98765, ExitSignal: 17}) {
		t.Fatalf("%+v", st)
	}
	if st.Exited() {
		t.Fatal("a sleeping process has exited")
	}
	// Up to the start time only: no exit signal.
	short := "1 (x) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615"
	for _, bad := range []string{"", "1 (x", "1 x) S", "1 (x) S 1 2 3", short,
		statLine("x", "y", "5", "17"), statLine("x", "1", "-5", "17"), statLine("x", "1", "5", "SIGCHLD")} {
		if _, err := ParseStat(bad); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestExited(t *testing.T) {
	for state, want := range map[byte]bool{'R': false, 'S': false, 'D': false, 'T': false, 'Z': true, 'X': true} {
		if got := (Stat{State: state}).Exited(); got != want {
			t.Errorf("%c: %v", state, got)
		}
	}
}

func TestReadStatSelf(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != os.Getppid() || st.StartTime == 0 || st.Exited() {
		t.Fatalf("%+v", st)
	}
	if _, err := ReadStat(-1); err == nil {
		t.Fatal("read the stat of pid -1")
	}
}

// A thread's stat is its own: the main thread's names the process's
// parent; a thread the process does not have has none.
func TestReadTaskStatSelf(t *testing.T) {
	st, err := ReadTaskStat(os.Getpid(), os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != os.Getppid() || st.StartTime == 0 || st.Exited() {
		t.Fatalf("%+v", st)
	}
	if _, err := ReadTaskStat(os.Getpid(), os.Getppid()); err == nil {
		t.Fatal("read the stat of a thread this process does not have")
	}
}

func TestBootIDTrimmed(t *testing.T) {
	id, err := BootID()
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 36 {
		t.Fatalf("boot id %q", id)
	}
}

func TestParseCgroups(t *testing.T) {
	got := ParseCgroups("12:cpu,cpuacct:/user.slice\n1:name=systemd:/a:b\n0::/init.scope\nbogus\nx:y:z\n")
	want := []Cgroup{
		{12, "cpu,cpuacct", "/user.slice"},
		{1, "name=systemd", "/a:b"},
		{0, "", "/init.scope"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
	if self, err := SelfCgroups(); err != nil || len(self) == 0 {
		t.Fatalf("%v %v", self, err)
	}
}

func TestHolders(t *testing.T) {
	dir := t.TempDir()
	sub := dir + "/images"
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	f, err := os.Open(sub)
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// Held below dir, and still after the directory is removed; the
	// caller's own descriptors do not count.
	for _, remove := range []bool{false, true} {
		if remove {
			os.RemoveAll(sub)
		}
		if got := Holders(dir); !slices.Equal(got, []int{cmd.Process.Pid}) {
			t.Errorf("Holders (removed %v) = %v, want [%d]", remove, got, cmd.Process.Pid)
		}
	}
	if got := Holders(dir + "x"); len(got) != 0 {
		t.Errorf("a sibling directory's name prefix matched: %v", got)
	}
}

// status is a /proc/PID/status as the kernel writes it, of a set-uid
// process in a nested PID namespace.
const status = `Name:	postgres
Umask:	0077
State:	S (sleeping)
Tgid:	4242
Ngid:	0
Pid:	4243
PPid:	1
TracerPid:	77
Uid:	0	100	0	100
Gid:	5	5	5	5
FDSize:	64
Groups:	5
NStgid:	4242	12
NSpid:	4243	13
NSpgid:	4242	12
VmRSS:	    2048 kB
RssAnon:	     512 kB
RssFile:	    1536 kB
Threads:	2
SigBlk:	0000000000000000
CapPrm:	000001ffffffffff
CapEff:	000001fffeffffff
Cpus_allowed_list:	0-1
`

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus(status)
	if err != nil {
		t.Fatal(err)
	}
	want := Status{
		Name:      "postgres",
		Tgid:      4242,
		TracerPid: 77,
		Uid:       [4]int{0, 100, 0, 100},
		Gid:       [4]int{5, 5, 5, 5},
		NSpid:     []int{4243, 13},
		CapEff:    0x000001fffeffffff,
		RssAnon:   512 << 10,
	}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("got  %+v\nwant %+v", st, want)
	}
	// The lines a kernel thread's status lacks are zero.
	if st, err := ParseStatus("Name:\tkthreadd\nTgid:\t2\n"); err != nil || !reflect.DeepEqual(st, Status{Name: "kthreadd", Tgid: 2}) {
		t.Fatalf("%+v %v", st, err)
	}
	for _, line := range []string{"Tgid:\tx", "TracerPid:\t", "Uid:\t0\t0\t0", "Gid:\t0\t0\tx\t0", "NSpid:\t1 a", "CapEff:\tzz", "RssAnon:\t512 MB", "RssAnon:\tx kB"} {
		if _, err := ParseStatus(status + line + "\n"); err == nil {
			t.Errorf("parsed %q", line)
		}
	}
}

func TestReadStatusSelf(t *testing.T) {
	st, err := ReadStatus(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != os.Getpid() || st.Uid[0] != os.Getuid() || st.Gid[0] != os.Getgid() || len(st.NSpid) == 0 || st.NSpid[0] != os.Getpid() || st.RssAnon == 0 {
		t.Fatalf("%+v", st)
	}
	if ns, err := NSpid(os.Getpid()); err != nil || !slices.Equal(ns, st.NSpid) {
		t.Errorf("NSpid = %v, %v; status has %v", ns, err, st.NSpid)
	}
	// Another thread of this process belongs to it.
	tids, err := Threads(os.Getpid())
	if err != nil || len(tids) < 2 || !slices.Contains(tids, os.Getpid()) {
		t.Fatalf("threads %v, %v", tids, err)
	}
	for _, tid := range tids {
		if st, err := ReadStatus(tid); err == nil && st.Tgid != os.Getpid() {
			t.Errorf("thread %d: Tgid %d", tid, st.Tgid)
		}
	}
	if _, err := ReadStatus(-1); err == nil {
		t.Fatal("read the status of pid -1")
	}
}

// A child shows in /proc, among the children of this process's threads,
// with its command line; once it has exited, unreaped, it is a zombie
// without one.
func TestChildrenAndCmdline(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	if got := Children(os.Getpid()); !slices.Contains(got, pid) {
		t.Errorf("Children = %v, want %d among them", got, pid)
	}
	tids, _ := Threads(os.Getpid())
	var found []int
	for _, tid := range tids {
		kids, err := TaskChildren(os.Getpid(), tid)
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, kids...)
	}
	if !slices.Contains(found, pid) {
		t.Errorf("TaskChildren = %v, want %d among them", found, pid)
	}
	if pids, err := Pids(); err != nil || !slices.Contains(pids, pid) || !slices.Contains(pids, os.Getpid()) {
		t.Errorf("Pids = %v, %v; want %d and %d among them", pids, err, pid, os.Getpid())
	}
	if args, err := Cmdline(pid); err != nil || !slices.Equal(args, []string{"sleep", "60"}) {
		t.Errorf("Cmdline = %q, %v", args, err)
	}
	if st, err := ReadStat(pid); err != nil || st.Comm != "sleep" || st.PPid != os.Getpid() || st.ExitSignal != int(syscall.SIGCHLD) {
		t.Errorf("stat %+v, %v", st, err)
	}

	cmd.Process.Kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, err := ReadStat(pid); err == nil && st.Exited() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed child did not become a zombie")
		}
	}
	if args, err := Cmdline(pid); err != nil || args != nil {
		t.Errorf("a zombie's Cmdline = %q, %v", args, err)
	}
	if Exists(pid) {
		t.Error("a zombie exists")
	}
	cmd.Wait()
	if _, err := Cmdline(pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a reaped child's Cmdline: %v", err)
	}
}
