package lazy

import (
	"fmt"
	"strings"
	"testing"

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
