package lazy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/procfs"
)

// statLine is a /proc/PID/stat line of comm in state, with exit signal sig.
func statLine(comm, state string, sig int) string {
	f := make([]string, 50)
	for i := range f {
		f[i] = "0"
	}
	f[0] = state
	f[35] = fmt.Sprint(sig) // field 38 of the line
	return "123 (" + comm + ") " + strings.Join(f, " ")
}

// Only a process named as the plugin names twins, whose exit signal is 0,
// is a twin: a process the source named so itself, with an ordinary exit
// signal, is not reaped as one.
func TestIsTwin(t *testing.T) {
	for _, c := range []struct {
		line string
		twin bool
	}{
		{statLine(TwinName, "S", 0), true},
		{statLine(TwinName, "Z", 0), true},
		{statLine(TwinName, "Z", 17), false},
		{statLine("sleep", "Z", 0), false},
		{statLine("x) ("+TwinName, "Z", 0), false},
	} {
		st, err := procfs.ParseStat(c.line)
		if err != nil {
			t.Fatal(err)
		}
		if got := isTwin(st); got != c.twin {
			t.Errorf("isTwin(%q) = %v, want %v", c.line, got, c.twin)
		}
	}
}

// A births file's lines are "PID TID TICKS CHILD..."; a line cut short or
// damaged is left out.
func TestParseBirth(t *testing.T) {
	b, ok := parseBirth("12 13 4567 20 21")
	if !ok || b.pid != 12 || b.ticks != 4567 || !b.before[20] || !b.before[21] || len(b.before) != 2 {
		t.Errorf("parseBirth: %+v, %v", b, ok)
	}
	for _, line := range []string{"", "12 13", "12 13 x", "12 13 45 2x", "-1 1 2"} {
		if _, ok := parseBirth(line); ok {
			t.Errorf("parseBirth(%q) took a damaged line", line)
		}
	}
}

// ReapUnnamedTwins leaves alone a zombie child with an exit signal, born
// after the line's time: a child of the process's own, whose wait it must
// not steal. A missing births file is no twin.
func TestReapUnnamedTwinsLeavesOwnChildren(t *testing.T) {
	if n, err := ReapUnnamedTwins(filepath.Join(t.TempDir(), "none")); n != 0 || err != nil {
		t.Fatalf("no births file: %d, %v", n, err)
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := procfs.ReadStat(cmd.Process.Pid)
		if err == nil && st.Exited() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d not a zombie: %+v, %v", cmd.Process.Pid, st, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	births := filepath.Join(t.TempDir(), "births")
	line := fmt.Sprintf("%d %d 0\n", os.Getpid(), os.Getpid())
	if err := os.WriteFile(births, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := ReapUnnamedTwins(births); n != 0 || err != nil {
		t.Fatalf("ReapUnnamedTwins: %d, %v", n, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("waiting for the child after ReapUnnamedTwins: %v", err)
	}
}
