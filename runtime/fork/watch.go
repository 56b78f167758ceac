package fork

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/internal/fds"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/procfs"
)

// RestoreWatchCommand is the hidden argv[1] under which the tclone binary
// runs as a restore watchdog. The binary's main calls
// RunRestoreWatchIfAsked first thing.
const RestoreWatchCommand = "__tclone-restore-watch"

// A restoreWatch is a separate process that undoes a materialisation whose
// tclone died before committing it. Without it, a sibling that crun had
// already restored runs on holding its caller's stdio: conmon, which saw
// its runtime die, blocks reading the runtime's stderr until every holder
// closes it, and Podman holds the container's lock until conmon answers
// (`podman ps -a` hangs). The watchdog kills and deletes the sibling at
// once, so conmon reads end-of-file and reports the failure.
//
// It runs in its own session and in tclone's own cgroup (cgroups.Escape), so
// that neither a signal to the caller's process group nor a kill of the
// caller's whole cgroup takes it along. Its stdio is /dev/null. It holds
// the caller's stderr as descriptor 3 only to say, once the sibling is
// gone, what happened: conmon passes the first thing it reads there to
// Podman as the error, and otherwise reports an empty one.
//
// Protocol on its stdin: "watch PID START" names a process of the restore
// (crun) to kill with its descendants if tclone dies; "reporting JSON" is
// the operation's journal record, sent just before tclone ends the entry
// on its way to exiting 0; "done" means the sibling was reported, or the
// operation undid itself, and the watchdog exits touching nothing. End of
// input without "done" means tclone died: it never exited 0, so its caller
// (conmon) saw a failure, and the sibling is undone, from the entry, or from
// the "reporting" record when tclone died after ending the entry.
type restoreWatch struct {
	cmd *exec.Cmd
	w   *os.File
}

// watchConfig tells the watchdog where the operation is recorded and how
// to reach crun the way the restore did.
type watchConfig struct {
	Layout plan.Layout  `json:"layout"`
	Entry  string       `json:"entry"`
	Crun   crun.Runtime `json:"crun"`
	// Report is set when descriptor 3 is the caller's stderr.
	Report bool `json:"report"`
}

// startRestoreWatch starts the watchdog of a materialisation recorded by
// entry.
// callerStderr is where the watchdog reports, if it is a file.
func (e *Engine) startRestoreWatch(entry *journal.Entry, callerStderr io.Writer) (*restoreWatch, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("starting the restore watchdog: %w", err)
	}
	stderr, report := callerStderr.(*os.File)
	cfg, err := json.Marshal(watchConfig{
		Layout: e.Store.Layout, Entry: entry.Name(), Crun: *e.Crun, Report: report,
	})
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting the restore watchdog: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(self, RestoreWatchCommand, string(cfg))
	cmd.Stdin = r
	if report {
		cmd.ExtraFiles = []*os.File{stderr}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the restore watchdog %s: %w", self, err)
	}
	if err := cgroups.Escape(cmd.Process.Pid); err != nil {
		// It still covers a kill of tclone alone, the common case.
		logrus.Warnf("restore watchdog stays in its caller's cgroup: %v", err)
	}
	return &restoreWatch{cmd: cmd, w: w}, nil
}

// Watch names a process of the restore the watchdog kills, with its
// descendants, if tclone dies.
func (rw *restoreWatch) Watch(pid int) {
	if rw == nil {
		return
	}
	o, ok := journal.OwnerOf(pid)
	if !ok {
		return
	}
	fmt.Fprintf(rw.w, "watch %d %d\n", o.Pid, o.StartTime)
}

// Reporting hands the watchdog the operation's record before tclone ends
// its journal entry (materializeOp.reported).
func (rw *restoreWatch) Reporting(rec journal.Record) error {
	if rw == nil {
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(rw.w, "reporting %s\n", b)
	return err
}

// Done releases the watchdog: the sibling was reported, or the operation
// undid itself. It does not wait for the watchdog to exit: from "done" on,
// a SIGKILL of this tclone is one the watchdog no longer covers (conmon
// would then see the runtime fail while the sibling it restored runs on,
// and wait for ever on its stderr), so the caller exits right after. The
// watchdog, exiting on its own, is reaped by whoever inherits it.
func (rw *restoreWatch) Done() {
	if rw == nil {
		return
	}
	fmt.Fprintln(rw.w, "done")
	rw.w.Close()
}

// RunRestoreWatchIfAsked runs the watchdog and exits when argv asks for it.
func RunRestoreWatchIfAsked() {
	var cfg watchConfig
	if !fds.HelperArgs(RestoreWatchCommand, &cfg, 3) {
		return
	}
	report := io.Discard
	if cfg.Report {
		// Closed when the watchdog exits: that is what lets conmon go on.
		report = os.NewFile(3, "caller's stderr")
	}
	os.Exit(runRestoreWatch(cfg, os.Stdin, report))
}

// runRestoreWatch waits for the end of the restore, undoes it if its tclone
// died, and says so on report.
func runRestoreWatch(cfg watchConfig, in io.Reader, report io.Writer) int {
	watched, reporting, done := readWatchProtocol(in)
	if done {
		return 0
	}
	rt := cfg.Crun
	e := &Engine{Crun: &rt, Store: plan.Store{Layout: cfg.Layout}}
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	id, err := e.abandonMaterialize(ctx, cfg.Entry, watched, reporting)
	if id == "" && err == nil {
		return 0 // nothing was left to undo
	}
	if err != nil {
		e.writeWatchLog(cfg.Entry, err)
		fmt.Fprintf(report, "tclone restore of %s died before the sibling was complete, and removing what it made failed: %v; run `tclone gc`\n", id, err)
		return 1
	}
	fmt.Fprintf(report, "tclone restore of %s died before the sibling was complete; the half-made sibling was removed, fork again\n", id)
	return 0
}

// abandonTimeout bounds a watchdog's cleanup: conmon waits for it.
const abandonTimeout = time.Minute

// readWatchProtocol reads the watched processes and the reporting record
// until "done" or the end of input.
func readWatchProtocol(in io.Reader) (watched []journal.Owner, reporting *journal.Record, done bool) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "reporting "); ok {
			var rec journal.Record
			if json.Unmarshal([]byte(rest), &rec) == nil {
				reporting = &rec
			}
			continue
		}
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) == 1 && fields[0] == "done":
			return watched, reporting, true
		case len(fields) == 3 && fields[0] == "watch":
			pid, perr := strconv.Atoi(fields[1])
			st, serr := strconv.ParseUint(fields[2], 10, 64)
			if perr == nil && serr == nil {
				watched = append(watched, journal.Owner{Pid: pid, StartTime: st})
			}
		}
	}
	if sc.Err() != nil {
		// A line too long to read: tclone's end of input is still what
		// says whether it died.
		io.Copy(io.Discard, in)
	}
	return watched, reporting, false
}

// abandonMaterialize undoes the materialisation recorded by the journal
// entry name, whose tclone died: it adopts the entry (no other recovery
// touches it meanwhile), kills what the restore was still running, removes
// the sibling and what was made for it, and gives back the plan's use.
// An entry already gone is undone from reporting, the record tclone handed
// over before it ended the entry, if it did (the plan's use, recorded by
// then, is not given back). It returns the sibling's ID, or "" if there was
// nothing to undo.
func (e *Engine) abandonMaterialize(ctx context.Context, name string, watched []journal.Owner, reporting *journal.Record) (string, error) {
	// A crun restore that is still running would go on making the sibling
	// (and CRIU, its child, on holding the caller's stdio), whoever undoes
	// the operation.
	for _, o := range watched {
		killTree(o)
	}
	entry, err := e.journal().Adopt(name)
	if err != nil {
		return "", err
	}
	var rec journal.Record
	switch {
	case entry != nil:
		rec = entry.Rec
	case reporting != nil && !e.claimedElsewhere(name):
		rec = *reporting
	default:
		// Ended, or another recovery holds the entry and undoes it.
		return "", nil
	}
	if rec.Phase == journal.PhaseCommitted {
		// An older tclone died between reporting the sibling and
		// removing the entry: the sibling is the user's now.
		return "", entry.End()
	}
	sib := rec.MaterializeRec()
	errs := []error{e.undoMaterialize(ctx, rec)}
	switch {
	case rec.PlanDir == "":
	case sib.OwnsPlan:
		errs = append(errs, e.Store.Remove(rec.PlanDir))
	case entry == nil:
		// The use was recorded as spent before the entry ended.
	default:
		// The dead restore's use goes back to the plan.
		_, err := e.Store.Sweep(rec.PlanDir, time.Now())
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		// Leave the entry for `tclone gc` to try again.
		return sib.SiblingID, fmt.Errorf("undoing sibling %s after its tclone died: %w", sib.SiblingID, err)
	}
	return sib.SiblingID, entry.End()
}

// claimedElsewhere says whether another recovery has claimed the journal
// entry name.
func (e *Engine) claimedElsewhere(name string) bool {
	m, _ := filepath.Glob(filepath.Join(e.Store.JournalDir(), name+journal.ClaimSep+"*"))
	return len(m) > 0
}

// killTree kills a process and all its descendants, if it is still the
// process o names.
func killTree(o journal.Owner) {
	if !o.Alive() {
		return
	}
	// Stop the root first so it forks no more, then its descendants.
	syscall.Kill(o.Pid, syscall.SIGSTOP)
	for _, pid := range descendants(o.Pid) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	syscall.Kill(o.Pid, syscall.SIGKILL)
}

// descendants lists the processes below root.
func descendants(root int) []int { return procfs.Tree(root)[1:] }

// writeWatchLog keeps a watchdog's failure where an administrator looks:
// its stdio is /dev/null.
func (e *Engine) writeWatchLog(entry string, err error) {
	if mkErr := os.MkdirAll(e.Store.LogDir, 0o700); mkErr != nil {
		return
	}
	name := fmt.Sprintf("restore-watch-%s-%s.log", strings.TrimSuffix(entry, ".json"), logTime())
	msg := fmt.Sprintf("%s: %v\nrun `tclone gc` to finish the cleanup\n", time.Now().UTC().Format(time.RFC3339), err)
	os.WriteFile(filepath.Join(e.Store.LogDir, name), []byte(msg), 0o600)
}

// HoldersOf lists the processes with a descriptor open on dir or below it:
// for a sibling's images, a restore's CRIU and the tasks it forked.
func HoldersOf(dir string) []int { return procfs.Holders(dir) }
