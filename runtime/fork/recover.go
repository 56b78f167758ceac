package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/runtime/rootfs"
	"github.com/tclone/tclone/runtime/wptrack"
)

// Recovered reports what a recovery pass cleaned up.
type Recovered struct {
	Captures     int      `json:"captures"`      // interrupted captures undone
	Siblings     int      `json:"siblings"`      // interrupted materialisations undone
	Thawed       []string `json:"thawed"`        // sources found frozen and thawed
	ExpiredPlans int      `json:"expired_plans"` // unused plans past their expiry
	StraySnaps   int      `json:"stray_snapshots"`
	// Plans are the plans removed by the sweep, each with why.
	Plans []RemovedPlan `json:"plans"`
	// Locks are lock files no one held.
	Locks []string `json:"locks"`
	// LazyDaemons are the plans whose dead lazy-pages daemon's files were
	// removed.
	LazyDaemons []string `json:"lazy_daemons,omitempty"`
	// Intents are the containers whose fork intent no checkpoint would
	// take (its client died first, or it expired).
	Intents []string `json:"intents,omitempty"`
	// OrphanCRIUs is how many CRIU processes working in a plan that is
	// gone were killed.
	OrphanCRIUs int `json:"orphan_criu,omitempty"`
	// CRIUTemps are the temporary directories (and mounts) killed CRIUs
	// left in /tmp, removed.
	CRIUTemps []string `json:"criu_temps,omitempty"`
	// Trackings are the sources whose write tracking (incremental
	// branches) had ended: its holder was gone.
	Trackings []string `json:"trackings,omitempty"`
	// SnapshotsHeld are not cleaned up: the copy-on-write snapshots live
	// plans' daemons hold, by plan ID, with the memory they keep. Each is
	// released once its plan is used up, removed or expired.
	SnapshotsHeld map[string]lazy.Info `json:"snapshots_held,omitempty"`
}

// RemovedPlan is a plan the sweep removed.
type RemovedPlan struct {
	ID string `json:"id"`
	// Reason is plan.SweptUsedUp, plan.SweptExpired or
	// plan.SweptClientGone.
	Reason string `json:"reason"`
}

func (r *Recovered) empty() bool {
	return r.Captures+r.Siblings+r.StraySnaps+len(r.Plans)+len(r.Thawed)+len(r.Locks)+len(r.LazyDaemons)+len(r.Intents)+r.OrphanCRIUs+len(r.CRIUTemps) == 0
}

// Recover undoes every fork operation whose tclone process died, removes
// plans past their expiry or whose client died, root filesystem snapshots
// no plan refers to (those a crash followed by a reboot left), and lock
// files no one holds. `tclone gc` runs it, then rolls back the fork calls
// of dead clients (runtime/calls), which needs Podman and so cannot run
// inside a verb Podman called.
func (e *Engine) Recover(ctx context.Context) (*Recovered, error) {
	r, err := e.recoverOperations(ctx)
	if r == nil {
		r = &Recovered{}
	}
	n, serr := e.removeStraySnapshots()
	r.StraySnaps = n
	// Intents first: the intent locks they take go with the others.
	intents, ierr := e.Store.CollectIntents()
	r.Intents = intents
	locks, lerr := e.Store.CollectLocks()
	r.Locks = locks
	removing, rerr := e.Store.CollectRemoving()
	for _, d := range removing {
		r.Plans = append(r.Plans, RemovedPlan{ID: filepath.Base(d), Reason: "its removal was cut short"})
	}
	lerr = errors.Join(lerr, rerr)
	daemons, derr := lazy.Collect(e.Store.Layout)
	r.LazyDaemons = daemons
	r.OrphanCRIUs = e.killOrphanCRIUs()
	// The CRIUs just killed may not be gone yet: their leftovers then
	// wait for the next gc.
	temps, terr := sweepCRIUTemps(criuTempDir, criuRunning)
	r.CRIUTemps = temps
	held, herr := lazy.Holders(e.Store.Layout)
	r.SnapshotsHeld = held
	tracks, trerr := wptrack.Collect(e.trackDir())
	r.Trackings = tracks
	return r, errors.Join(err, serr, lerr, derr, ierr, terr, herr, trerr)
}

// recoverOperations undoes operations whose process died and sweeps plans:
// what every capture and materialisation does first, cheaply.
func (e *Engine) recoverOperations(ctx context.Context) (*Recovered, error) {
	var r Recovered
	var errs []error
	orphans, err := e.journal().Orphans()
	if err != nil {
		return nil, err
	}
	for _, o := range orphans {
		var err error
		switch {
		case o.Rec.Phase == journal.PhaseCommitted:
			// Finished and reported done: only the entry is left.
		case o.Rec.Kind == journal.Capture:
			err = e.recoverCapture(ctx, o.Rec, &r)
		case o.Rec.Kind == journal.Materialize:
			// Its use of the plan, if it took one, is given back when the
			// plans are swept below: the plan records who holds each use.
			errs = append(errs, e.undoMaterialize(ctx, o.Rec))
			if o.Rec.MaterializeRec().OwnsPlan && o.Rec.PlanDir != "" {
				errs = append(errs, e.Store.Remove(o.Rec.PlanDir))
			}
			r.Siblings++
		}
		var held *sourceHeldError
		if errors.As(err, &held) {
			// The entry stays until its source is known to run freely.
			errs = append(errs, err, o.Unclaim())
			continue
		}
		errs = append(errs, err, o.End())
	}
	r.Plans, err = e.sweepPlans(time.Now())
	for _, p := range r.Plans {
		if p.Reason == plan.SweptExpired {
			r.ExpiredPlans++
		}
	}
	// ksmd back to the host's settings if no merging fork is young (its
	// settle process may have died).
	errs = append(errs, err, e.settleKSM())
	return &r, errors.Join(errs...)
}

// recoverCapture undoes a capture whose tclone died: it releases the source
// (ends its CRIU, removes CRIU's network lock and repair mode, or thaws what
// an older tclone froze), then removes the snapshot and the plan. A source
// that cannot be released yet is reported as a *sourceHeldError.
func (e *Engine) recoverCapture(ctx context.Context, entry journal.Record, r *Recovered) error {
	rec := entry.CaptureRec()
	if err := e.thawLegacyFreeze(entry, r); err != nil {
		return err
	}
	if entry.Phase == journal.CaptureSeized {
		// A live capture of the same source may hold a network lock of its
		// own right now: wait for none, and try later if one runs.
		expired, cancel := context.WithCancel(ctx)
		cancel()
		unlock, err := e.lockSource(expired, rec.SourceID)
		if err != nil {
			return &sourceHeldError{source: rec.SourceID, err: fmt.Errorf("another capture of it is running: %w", err)}
		}
		err = e.releaseSource(entry, true)
		unlock()
		if err != nil {
			return err
		}
	}
	var errs []error
	// Twins the capture had die with their lifelines, in this process's
	// death; their zombies are the source's to lose.
	if rec.Source != nil && rec.Source.CgroupDir != "" {
		if _, err := lazy.ReapTwinZombies(rec.Source.CgroupDir); err != nil {
			errs = append(errs, err)
		}
	}
	if entry.PlanDir != "" {
		// A twin killed before it named itself, its capture dead too.
		if _, err := lazy.ReapUnnamedTwins(criuhooks.TwinBirths(plan.WorkDir(entry.PlanDir))); err != nil {
			errs = append(errs, err)
		}
	}
	if rec.SnapshotPath != "" {
		snap := rootfs.Snapshot{Kind: rootfs.Kind(rec.SnapshotKind), Path: rec.SnapshotPath}
		errs = append(errs, snap.Remove())
	}
	if entry.PlanDir != "" {
		errs = append(errs, e.Store.Remove(entry.PlanDir))
	}
	r.Captures++
	return errors.Join(errs...)
}

// thawLegacyFreeze thaws a source that a capture of an older tclone froze
// and never thawed. Only such a capture's phase says so: a container the
// user paused since must stay paused.
func (e *Engine) thawLegacyFreeze(entry journal.Record, r *Recovered) error {
	rec := entry.CaptureRec()
	if entry.Phase != journal.CaptureFrozen || rec.FreezerDir == "" {
		return nil
	}
	f := &cgroups.Freezer{Dir: rec.FreezerDir, V2: cgroups.Unified()}
	was, err := f.ThawIfFrozen()
	if err != nil {
		return &sourceHeldError{source: rec.SourceID, err: err}
	}
	if was {
		r.Thawed = append(r.Thawed, rec.SourceID)
	}
	return nil
}

// RecoverQuietly recovers interrupted operations and only logs what went
// wrong: a stale entry must not stop a new fork.
func (e *Engine) RecoverQuietly(ctx context.Context) {
	r, err := e.recoverOperations(ctx)
	if err != nil {
		logrus.Warnf("cleaning up after an earlier interrupted fork: %v", err)
	}
	if r != nil && !r.empty() {
		logrus.Debugf("cleaned up after earlier forks: %+v", *r)
	}
}

// sweepPlans gives back uses whose holder died, and removes plans that are
// used up, expired, or held for a fork client that died, unless a restore
// still holds a use.
func (e *Engine) sweepPlans(now time.Time) ([]RemovedPlan, error) {
	ids, err := e.Store.List()
	if err != nil {
		return nil, err
	}
	var removed []RemovedPlan
	var errs []error
	for _, id := range ids {
		// A plan without plan.json is a capture in progress (its journal
		// entry is alive) or one a crash cut short (its orphan entry was
		// handled above); Sweep leaves it alone.
		reason, err := e.Store.Sweep(e.Store.Dir(id), now)
		errs = append(errs, err)
		if reason != "" {
			removed = append(removed, RemovedPlan{ID: id, Reason: reason})
		}
	}
	return removed, errors.Join(errs...)
}

// removeStraySnapshots deletes root filesystem snapshots whose plan is gone,
// including btrfs snapshots kept beside their subvolume, which the store
// records by a marker.
func (e *Engine) removeStraySnapshots() (int, error) {
	entries, err := os.ReadDir(e.Store.SnapshotRoot)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, ent := range entries {
		id := strings.TrimSuffix(strings.TrimSuffix(ent.Name(), plan.ExternalSnapshotSuffix), plan.VolumesSuffix)
		if _, err := os.Stat(e.Store.Dir(id)); err == nil {
			continue
		}
		errs = append(errs, e.Store.RemoveSnapshots(id))
		n++
	}
	return n, errors.Join(errs...)
}

// removeSibling deletes a sibling crun may know, under the crun state root
// the operation that made it used.
func (e *Engine) removeSibling(ctx context.Context, crunRoot, id string) error {
	rt := *e.Crun
	rt.Global.Root = crunRoot
	if _, err := os.Stat(filepath.Join(rt.Global.StateRoot(), id)); err != nil {
		return nil
	}
	if _, err := rt.Output(ctx, "delete", "--force", id); err != nil {
		if _, serr := os.Stat(filepath.Join(rt.Global.StateRoot(), id)); serr == nil {
			return fmt.Errorf("deleting sibling %s: %w", id, err)
		}
	}
	return nil
}

// killOrphanCRIUs kills the CRIU processes still working in a plan that is
// gone. A capture killed after it started CRIU but before CRIU announced
// itself (the journal learns of CRIU at its first notification) leaves a
// CRIU nobody will ever talk to; one was seen asleep in its kernel probe an
// hour later. So does a CRIU killed while one of its kernel probes had a
// child stopped: the child (comm criu, in CRIU's working directory) stays
// stopped, with no parent or tracer left to end it. Neither holds anything
// of the source, only the plan's files. Returns how many it killed.
func (e *Engine) killOrphanCRIUs() int {
	n := 0
	pids, _ := procfs.Pids()
	orphan := func(pid int) bool {
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil || !e.Store.InGonePlan(cwd) {
			return false
		}
		st, err := procfs.ReadStat(pid)
		return err == nil && st.Comm == "criu"
	}
	for _, pid := range pids {
		if !orphan(pid) {
			continue
		}
		// Through a pidfd, looked at again once it is open and found still
		// alive after that: the kill and the wait below are for the
		// process judged, and no other that took its PID.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if orphan(pid) && unix.PidfdSendSignal(fd, 0, nil, 0) == nil && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			n++
			// Dead, CRIU's temporary directories can be swept at once.
			procfs.PidfdExited(fd, 2*time.Second)
		}
		unix.Close(fd)
	}
	return n
}
