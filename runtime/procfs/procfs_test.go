package procfs

import (
	"os"
	"os/exec"
	"reflect"
	"slices"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses.
	line := "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615\n"
	st, err := ParseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stat{State: 'S', PPid: 1, StartTime: 98765}) {
		t.Fatalf("%+v", st)
	}
	if st.Exited() {
		t.Fatal("a sleeping process has exited")
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2 3", "1 (x) S x 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"} {
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
