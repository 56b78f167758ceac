package fork

import (
	"time"

	"github.com/sirupsen/logrus"
)

// The engine's debug log (tclone --debug, or --log-level debug) explains a
// fork step by step: each phase with its duration, the CRIU options a dump
// used, the crun command line of a restore. What failed is at the end.

// opLog is the log of one operation.
type opLog struct {
	*logrus.Entry
	start time.Time
	last  time.Time
}

func newOpLog(op, id string) *opLog {
	now := time.Now()
	return &opLog{Entry: logrus.WithFields(logrus.Fields{"op": op, "id": id}), start: now, last: now}
}

// phase logs the end of a phase: how long it took, and the operation's
// time so far. Fields are formatted only when the debug log is on: pass
// values (fmt.Stringers), not strings made for it.
func (l *opLog) phase(name string, fields logrus.Fields) {
	now := time.Now()
	defer func() { l.last = now }()
	if !l.Logger.IsLevelEnabled(logrus.DebugLevel) {
		return
	}
	l.WithFields(fields).WithFields(logrus.Fields{
		"phase": name, "phase_ms": ms(now.Sub(l.last)), "total_ms": ms(now.Sub(l.start)),
	}).Debug("phase done")
}

// failed logs the error an operation ends with, and where.
func (l *opLog) failed(err error) {
	l.WithError(err).WithField("total_ms", ms(time.Since(l.start))).Debug("failed")
}
