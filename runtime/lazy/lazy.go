// Package lazy runs one lazy-pages daemon (criuhooks/lazypages) per fork
// plan, so that siblings run as soon as CRIU has rebuilt their tasks and get
// their memory while they run.
//
// The daemon is tclone itself, re-executed under DaemonCommand, in its own
// session and in tclone's keeper cgroup: a kill of the caller that started
// it (conmon's `tclone restore`, a service's cgroup) does not take it, and so
// does not take the siblings it is filling (its guard kills every sibling
// still filling if the daemon dies, so that none ever runs on zeros).
//
// A restore asks the plan's daemon, over its control socket, to listen at
// the lazy-pages.socket of the restore's CRIU work directory, where `criu
// restore --lazy-pages` connects; it starts the daemon first if none
// answers, under the plan's lazy lock. The daemon serves its plan's images
// through hard links of its own, so the plan may be removed (its last use
// taken) while siblings still fill. It exits once no sibling is filling and
// no restore has been connected for IdleExit, taking the lock first so that
// a restore about to use it starts a new one instead.
package lazy

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/plan"
)

// DaemonCommand is the hidden argv[1] under which the tclone binary runs as
// a plan's lazy-pages daemon; main calls RunDaemonIfAsked first thing.
const DaemonCommand = "__tclone-lazy-pages"

// IdleExit is how long a daemon with nothing to fill waits for another
// restore of its plan before it exits. (A variable for the tests.)
var IdleExit = 10 * time.Second

// EnvChunkPause, set to a duration in the environment of the restore that
// starts a plan's daemon (or of the capture, for a plan whose capture
// starts it: twins, snapshots), makes the daemon wait that long between two
// background chunks of a task: the tests use it to catch siblings while
// they fill. Faults are still answered at once.
const EnvChunkPause = "TCLONE_LAZY_CHUNK_PAUSE"

// Paths of one plan's daemon.
type Paths struct {
	// Control is the daemon's control socket.
	Control string `json:"control"`
	// Lock serialises starting and stopping the daemon.
	Lock string `json:"lock"`
	// Images holds the daemon's hard links to the plan's images; it must
	// be on the plan store's file system.
	Images string `json:"images"`
	// Log is where the daemon logs.
	Log string `json:"log"`
}

// PathsFor names the files of plan id's daemon in layout l: its socket and
// lock in the lazy directory, its image links in the lazy images directory
// (on the plan store's tmpfs, where hard links to the plan's images can be
// made), its log in the log directory.
func PathsFor(l plan.Layout, id string) Paths {
	return Paths{
		Control: filepath.Join(l.LazyDir(), id+".sock"),
		Lock:    filepath.Join(l.LazyDir(), id+".lock"),
		Images:  filepath.Join(l.LazyImagesDir(), id),
		Log:     filepath.Join(l.LogDir, fmt.Sprintf("lazy-pages-%s.log", id)),
	}
}
