package fork

import (
	"testing"

	"github.com/sirupsen/logrus"
)

// A capture's CRIU logs warnings and errors, and at debug level only when
// tclone does: every line is written while CRIU holds the tree.
func TestDumpLogLevelFollowsTclones(t *testing.T) {
	was := logrus.GetLevel()
	t.Cleanup(func() { logrus.SetLevel(was) })
	for level, want := range map[logrus.Level]int32{logrus.InfoLevel: 2, logrus.WarnLevel: 2, logrus.DebugLevel: 4, logrus.TraceLevel: 4} {
		logrus.SetLevel(level)
		if got := dumpLogLevel(); got != want {
			t.Errorf("tclone at %s: CRIU's dump logs at %d, want %d", level, got, want)
		}
	}
}
