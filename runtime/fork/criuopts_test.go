package fork

import (
	"testing"

	"github.com/sirupsen/logrus"
)

// A capture's CRIU logs at info level, and at debug level only when
// tclone does: the debug lines cost the source's pause about 0.3 ms per
// process.
func TestDumpLogLevelFollowsTclones(t *testing.T) {
	was := logrus.GetLevel()
	t.Cleanup(func() { logrus.SetLevel(was) })
	for level, want := range map[logrus.Level]int32{logrus.InfoLevel: 3, logrus.WarnLevel: 3, logrus.DebugLevel: 4, logrus.TraceLevel: 4} {
		logrus.SetLevel(level)
		if got := dumpLogLevel(); got != want {
			t.Errorf("tclone at %s: CRIU's dump logs at %d, want %d", level, got, want)
		}
	}
}
