package lazy

import (
	"fmt"
	"strings"
	"testing"
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
func TestParseTwinStat(t *testing.T) {
	for _, c := range []struct {
		line  string
		state string
		ok    bool
	}{
		{statLine(TwinName, "S", 0), "S", true},
		{statLine(TwinName, "Z", 0), "Z", true},
		{statLine(TwinName, "Z", 17), "", false},
		{statLine("sleep", "Z", 0), "", false},
		{statLine("x) ("+TwinName, "Z", 0), "", false},
		{"123 (" + TwinName + ") S 1 2", "", false},
	} {
		state, ok := parseTwinStat(c.line)
		if state != c.state || ok != c.ok {
			t.Errorf("parseTwinStat(%q) = %q, %v; want %q, %v", c.line, state, ok, c.state, c.ok)
		}
	}
}
