package lazy

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/inject"
	"github.com/tclone/tclone/runtime/procfs"
)

// A twin plan's daemon holds the twins (criuhooks.Twin) of the source's
// processes: their memory files, pidfds and lifelines. When it exits it
// ends them (SIGKILL), waits until each has exited and reaps it from its
// parent, a process of the source (inject.Reap): a twin's exit signal is 0,
// so its zombie is nothing the source's programs would ever wait for.
//
// A daemon killed before that leaves its twins to die with their last
// lifeline (its guard's copy), as zombies; the record it was started with
// (<id>.twins.json in the lazy directory) names them, and Collect reaps
// them. A capture that died before its daemon started leaves zombies no
// record names: ReapTwinZombies finds them among the source's children.

// TwinName is the name (comm) the plugin gives every twin.
const TwinName = "tclone-twin"

// twinRecord names one twin so that it can be told from a process that
// took its pid since.
type twinRecord struct {
	// Pid is the process it is a twin of; Twin the twin; both host pids.
	Pid     int    `json:"pid"`
	Twin    int    `json:"twin"`
	Started uint64 `json:"started"` // the twin's start time (procfs.Stat)
}

// twinsRecord is what a twin plan's daemon holds, on disk.
type twinsRecord struct {
	SourceCgroup string       `json:"source_cgroup"`
	Twins        []twinRecord `json:"twins"`
}

func recordTwin(t *criuhooks.Twin) (twinRecord, error) {
	st, err := procfs.ReadStat(t.TwinPid)
	if err != nil {
		return twinRecord{}, fmt.Errorf("twin %d of process %d: %w", t.TwinPid, t.Pid, err)
	}
	return twinRecord{Pid: t.Pid, Twin: t.TwinPid, Started: st.StartTime}, nil
}

func twinsRecordPath(p Paths) string {
	return strings.TrimSuffix(p.Control, ".sock") + ".twins.json"
}

func writeTwinsRecord(p Paths, r twinsRecord) error {
	if err := atomicfile.WriteJSON(twinsRecordPath(p), r, 0o600); err != nil {
		return fmt.Errorf("lazy pages: recording the twins: %w", err)
	}
	return nil
}

func removeTwinsRecord(p Paths) error {
	return ignoreMissing(os.Remove(twinsRecordPath(p)))
}

// heldTwin is a twin the daemon holds.
type heldTwin struct {
	twinRecord
	imagePid        int32
	pidfd, lifeline *os.File
	once            sync.Once
	err             error
}

// twinExitWait bounds how long releaseTwins waits for a killed twin to
// exit; a SIGKILLed task that does not exit within it is stuck in the
// kernel, and its zombie is left to the next Collect.
var twinExitWait = 10 * time.Second

// ReleaseTwins ends and reaps twins a capture holds but will not hand to a
// daemon (it failed), and closes their descriptors.
func ReleaseTwins(twins []*criuhooks.Twin) error {
	var held []*heldTwin
	var errs []error
	for _, t := range twins {
		r, err := recordTwin(t)
		if err != nil {
			// Gone already, or not readable: its lifeline goes, and
			// ReapTwinZombies finds what is left.
			t.Close()
			errs = append(errs, err)
			continue
		}
		held = append(held, &heldTwin{twinRecord: r, pidfd: t.Pidfd, lifeline: t.Lifeline})
	}
	return errors.Join(append(errs, releaseTwins(held))...)
}

// releaseTwins ends the twins, reaps them, and closes what held them.
func releaseTwins(twins []*heldTwin) error {
	var errs []error
	for _, t := range twins {
		errs = append(errs, t.release())
	}
	return errors.Join(errs...)
}

// release ends and reaps the twin, once; later calls return the first's
// result.
func (t *heldTwin) release() error {
	t.once.Do(func() { t.err = t.end() })
	return t.err
}

func (t *heldTwin) end() error {
	defer t.pidfd.Close()
	defer t.lifeline.Close()
	fd := int(t.pidfd.Fd())
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("ending twin %d: %w", t.Twin, err)
	}
	exited, err := procfs.PidfdExited(fd, twinExitWait)
	if err != nil {
		return fmt.Errorf("waiting for twin %d to exit: %w", t.Twin, err)
	}
	if !exited {
		return fmt.Errorf("twin %d did not exit %s after SIGKILL", t.Twin, twinExitWait)
	}
	return reapTwin(t.twinRecord)
}

// reapTwin reaps an exited twin from its parent: the process it is a twin
// of, or whoever took it in when that process exited.
func reapTwin(r twinRecord) error {
	st, err := procfs.ReadStat(r.Twin)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.StartTime != r.Started {
		return nil // reaped; its pid is another process's now
	}
	if !st.Exited() {
		return fmt.Errorf("twin %d has not exited", r.Twin)
	}
	if err := reapRetrying(st.PPid, r.Twin, r.Started); err != nil {
		return fmt.Errorf("twin %d of process %d: %w", r.Twin, r.Pid, err)
	}
	return nil
}

// reapRetrying reaps the exited twin pid (started at started) from its
// parent. Another reaper may hold the parent traced for a moment (a
// capture of the same source reaps the zombies an earlier fork left, and a
// release of another plan's twins may run at once): it tries again until
// the twin is gone, by its hand or another's, or the wait is over.
func reapRetrying(parent, pid int, started uint64) error {
	deadline := time.Now().Add(twinReapWait)
	for {
		err := inject.Reap(parent, pid, started)
		if err == nil {
			return nil
		}
		now, serr := procfs.ReadStat(pid)
		if errors.Is(serr, os.ErrNotExist) || (serr == nil && now.StartTime != started) {
			return nil // someone else reaped it
		}
		if time.Now().After(deadline) {
			return err
		}
		if serr == nil {
			parent = now.PPid // reparented, maybe
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// twinReapWait bounds how long reapRetrying tries again while the twin's
// parent is traced by another process.
var twinReapWait = 5 * time.Second

// collectTwins reaps the twins a dead daemon of plan id had on record, and
// removes the record once none is left.
func collectTwins(p Paths) error {
	var rec twinsRecord
	err := atomicfile.ReadJSON(twinsRecordPath(p), &rec)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return errors.Join(fmt.Errorf("lazy pages: a damaged twins record %s: %w", twinsRecordPath(p), err), removeTwinsRecord(p))
	}
	var errs []error
	for _, r := range rec.Twins {
		st, err := procfs.ReadStat(r.Twin)
		if err == nil && st.StartTime == r.Started && !st.Exited() {
			// Its lifeline is held somewhere still (a guard about to
			// exit): it dies with it.
			errs = append(errs, fmt.Errorf("twin %d is still alive", r.Twin))
			continue
		}
		if err := reapTwin(r); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return removeTwinsRecord(p)
}

// ReapTwinZombies reaps every exited twin among the children of the
// processes of the cgroup directory procsDir (a container's: see
// cgroups.ProcsDir): a zombie named TwinName whose exit signal is 0, which
// is what a twin leaves when whoever held its lifeline died before it was
// reaped. It returns how many it reaped.
func ReapTwinZombies(procsDir string) (int, error) {
	procs, err := cgroups.Procs(procsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	reaped := 0
	var errs []error
	for _, parent := range procs {
		n, err := reapZombieChildren(parent, func(_ int, st procfs.Stat) bool { return isTwin(st) },
			"which its holder left as a zombie")
		reaped += n
		errs = append(errs, err)
	}
	return reaped, errors.Join(errs...)
}

// reapZombieChildren reaps each zombie child of parent that is picks', and
// logs it as what; it returns how many it reaped.
func reapZombieChildren(parent int, picks func(child int, st procfs.Stat) bool, what string) (int, error) {
	reaped := 0
	var errs []error
	for _, child := range procfs.Children(parent) {
		st, err := procfs.ReadStat(child)
		if err != nil || !st.Exited() || !picks(child, st) {
			continue
		}
		if err := reapRetrying(parent, child, st.StartTime); err != nil {
			errs = append(errs, fmt.Errorf("twin %d of process %d: %w", child, parent, err))
			continue
		}
		reaped++
		logrus.Infof("reaped twin %d, %s of %d", child, what, parent)
	}
	return reaped, errors.Join(errs...)
}

// ReapKilledTwin reaps twin, which the twin plugin made in process parent
// and killed before the twin could name itself (criuhooks.TwinError's
// Killed): a zombie ReapTwinZombies cannot tell from a child of the
// process's own. It waits, bounded, for the twin to exit, and reaps it
// only while it is still parent's child with no exit signal: a twin whose
// process died went to the container's init with SIGCHLD, which reaps it.
func ReapKilledTwin(parent, twin int) error {
	deadline := time.Now().Add(twinReapWait)
	for {
		st, err := procfs.ReadStat(twin)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the killed twin %d of process %d: %w", twin, parent, err)
		}
		if st.PPid != parent || st.ExitSignal != 0 {
			return nil
		}
		if st.Exited() {
			if err := reapRetrying(parent, twin, st.StartTime); err != nil {
				return fmt.Errorf("the killed twin %d of process %d: %w", twin, parent, err)
			}
			logrus.Infof("reaped twin %d, which the twin plugin killed, a zombie of %d", twin, parent)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the killed twin %d of process %d has not exited after %s", twin, parent, twinReapWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ReapUnnamedTwins reaps the twins the births file of a twin dump
// (criuhooks.TwinBirths) foretells that died before they named themselves
// and that no one reaped: a twin killed while its capture died too. Such
// a zombie has its process's name and no exit signal; it is told from a
// child of the process's own by the file's line for the process, written
// before the clone while the process was held: it is a zombie child of
// that process with no exit signal, born at the line's time or after (and
// by the time of the file's last write, give or take a second), and not
// one of the children the line lists. Named twins are ReapTwinZombies'.
// A missing file is no twin. It returns how many it reaped.
func ReapUnnamedTwins(births string) (int, error) {
	data, err := os.ReadFile(births)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the twins' births: %w", err)
	}
	fi, err := os.Stat(births)
	if err != nil {
		return 0, err
	}
	latest := bootTicksAt(fi.ModTime().Add(time.Second))
	reaped := 0
	var errs []error
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		b, ok := parseBirth(line)
		if !ok {
			continue // a line cut short by a death
		}
		if st, err := procfs.ReadStat(b.pid); err != nil || st.StartTime > b.ticks {
			continue // gone, and its pid maybe another's
		}
		// A named twin is ReapTwinZombies' to reap.
		n, err := reapZombieChildren(b.pid, func(child int, st procfs.Stat) bool {
			return st.ExitSignal == 0 && st.StartTime >= b.ticks && st.StartTime <= latest && !b.before[child] && !isTwin(st)
		}, "killed before it named itself, a zombie")
		reaped += n
		errs = append(errs, err)
	}
	return reaped, errors.Join(errs...)
}

// birth is a line of a births file: "PID TID TICKS CHILD...".
type birth struct {
	pid    int
	ticks  uint64
	before map[int]bool
}

func parseBirth(line string) (birth, bool) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return birth{}, false
	}
	pid, err1 := strconv.Atoi(f[0])
	ticks, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return birth{}, false
	}
	b := birth{pid: pid, ticks: ticks, before: map[int]bool{}}
	for _, c := range f[3:] {
		n, err := strconv.Atoi(c)
		if err != nil {
			return birth{}, false
		}
		b.before[n] = true
	}
	return b, true
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's start times.
const clockTicks = 100

// bootTicksAt is time t in clock ticks since boot.
func bootTicksAt(t time.Time) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return ^uint64(0)
	}
	at := time.Duration(ts.Nano()) - time.Since(t)
	if at < 0 {
		return 0
	}
	return uint64(at / (time.Second / clockTicks))
}

// LiveTwins lists the twins still alive among the children of the
// processes of the cgroup directory procsDir: while one is, a dump of the
// container would take it for one of its processes.
func LiveTwins(procsDir string) ([]int, error) {
	procs, err := cgroups.Procs(procsDir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, parent := range procs {
		for _, child := range procfs.Children(parent) {
			if st, err := procfs.ReadStat(child); err == nil && isTwin(st) && !st.Exited() {
				out = append(out, child)
			}
		}
	}
	return out, nil
}

// isTwin tells a twin by its stat: named TwinName, with exit signal 0.
func isTwin(st procfs.Stat) bool { return st.Comm == TwinName && st.ExitSignal == 0 }
