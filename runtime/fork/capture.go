package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
)

// CaptureRequest asks for a fork plan of a running container.
type CaptureRequest struct {
	Source  string
	Options CaptureOptions
	// Uses is how many siblings the plan serves (plan.Unlimited for any
	// number until it expires).
	Uses     int
	TTL      time.Duration
	Identity plan.Identity
	// TCP is what the siblings do with the source's established TCP
	// connections; it decides the dump's TCP options and is recorded in
	// the plan. Empty means close.
	TCP plan.TCPPolicy
}

// Captured is a finished capture.
type Captured struct {
	Plan *plan.Plan
	Dir  string
}

// Capture is Phase A. CRIU freezes the source's cgroup, dumps the whole tree
// leaving it running, and, while the tree is still frozen, the root
// filesystem is snapshotted, so memory and files come from one instant. Page
// images go to the tmpfs plan store. On any failure nothing is left: no plan,
// no snapshot, and the source running.
func (e *Engine) Capture(ctx context.Context, req CaptureRequest) (*Captured, error) {
	src, err := loadSource(ctx, e.Crun, req.Source)
	if err != nil {
		return nil, err
	}
	return e.captureSource(ctx, src, req)
}

// captureSource is Capture of a source already loaded and checked.
func (e *Engine) captureSource(ctx context.Context, src *source, req CaptureRequest) (*Captured, error) {
	start := time.Now()
	e.RecoverQuietly(ctx)
	check, err := criucheck.Check(ctx)
	if err != nil {
		return nil, err
	}
	unlock, err := e.lockSource(ctx, src.id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	rfs, err := rootfs.Detect(src.status.Rootfs)
	if err != nil {
		return nil, err
	}
	id, dir, err := e.Store.Create()
	if err != nil {
		return nil, err
	}
	snapDir := rootfs.SnapshotDir(rfs, e.Store.SnapshotRoot, id)
	if rfs.Kind == rootfs.KindBtrfs {
		if err := e.Store.RecordExternalSnapshot(id, snapDir); err != nil {
			e.Store.Remove(dir)
			return nil, fmt.Errorf("recording where the snapshot goes: %w", err)
		}
	}
	freezer := cgroups.FreezerFor(src.status.CgroupPath)
	entry, err := e.Journal.Begin(journal.Record{
		Kind: journal.Capture, Phase: "dump", PlanDir: dir, SourceID: src.id,
		CrunRoot: e.Crun.Global.Root, FreezerDir: freezer.Dir,
		SnapshotKind: string(rfs.Kind), SnapshotPath: snapDir,
	})
	if err != nil {
		e.Store.Remove(dir)
		return nil, err
	}
	fail := func(err error) (*Captured, error) {
		snap := rootfs.Snapshot{Kind: rfs.Kind, Path: snapDir}
		err = errors.Join(err, snap.Remove(), e.Store.Remove(dir))
		entry.End()
		return nil, err
	}
	crashPoint(CrashCaptureStarted)
	p, err := e.capture(ctx, src, rfs, id, dir, snapDir, freezer, check, req, entry)
	if err != nil {
		return fail(err)
	}
	p.Timings.TotalMs = ms(time.Since(start))
	if err := p.Write(dir); err != nil {
		return fail(fmt.Errorf("writing plan: %w", err))
	}
	uses := req.Uses
	if uses == 0 {
		uses = 1
	}
	if err := plan.SetUses(dir, uses); err != nil {
		return fail(fmt.Errorf("writing plan uses: %w", err))
	}
	return &Captured{Plan: p, Dir: dir}, entry.End()
}

func (e *Engine) capture(ctx context.Context, src *source, rfs rootfs.Source, id, dir, snapDir string, freezer *cgroups.Freezer, check *criucheck.Result, req CaptureRequest, entry *journal.Entry) (*plan.Plan, error) {
	images := plan.ImagesDir(dir)
	if err := os.WriteFile(filepath.Join(images, descriptorsFile), []byte(src.status.ExternalDescriptors), 0o600); err != nil {
		return nil, fmt.Errorf("saving the source's stdio descriptors: %w", err)
	}
	opts, err := dumpTCPOptions(req.Options, req.TCP, fmt.Sprintf("/proc/%d/net", src.state.Pid))
	if err != nil {
		return nil, err
	}
	d, err := e.dump(ctx, src, dir, freezer, check, opts, entry, func(ctx context.Context) (*rootfs.Snapshot, error) {
		return rootfs.Take(ctx, rfs, snapDir)
	})
	if err != nil {
		return nil, err
	}
	p := &plan.Plan{
		Version:   plan.FormatVersion,
		ID:        id,
		CreatedAt: time.Now().UTC(),
		ExpiresAt: time.Now().Add(ttlOrDefault(req.TTL)).UTC(),
		Source: plan.Source{
			ID: src.id, Bundle: src.state.Bundle, Rootfs: src.status.Rootfs, Pid: src.state.Pid,
			CgroupPath: src.status.CgroupPath, Hostname: src.spec.Hostname,
		},
		Rootfs:   d.snapshot,
		Capture:  opts,
		Identity: req.Identity,
		TCP:      req.TCP.OrClose(),
		Timings:  d.timings,
		Pages:    d.pages,
		Criu:     check.Version.String(),
	}
	if path, ok := namespacePath(src.spec, "network"); ok {
		p.Source.NetNSPath = path
	}
	// Unknown (0) only ever refuses a sibling that would keep connections.
	p.Source.NetNSInode, _ = netNSInode(src.state.Pid)
	if p.Identity == "" {
		p.Identity = plan.IdentityUnique
	}
	tree, err := summarizeTree(images)
	if err != nil {
		d.snapshot.Remove()
		return nil, err
	}
	p.Tree = tree
	return p, nil
}

func ttlOrDefault(ttl time.Duration) time.Duration {
	if ttl > 0 {
		return ttl
	}
	return DefaultPlanTTL
}

// Capture phases in the journal.
const (
	phaseFrozen = "frozen" // the source may be frozen by this capture
	phaseDumped = "dumped" // the source runs again
)

// freezeTimeout bounds the wait for every task of the source to freeze.
const freezeTimeout = 10 * time.Second

type dumped struct {
	snapshot *rootfs.Snapshot
	timings  plan.Timings
	pages    plan.PageStats
}

// dump runs CRIU. The only frozen state of the source lives inside this call:
// CRIU freezes and seizes, calls post-dump (the snapshot), then lets the tree
// go. A guard process thaws the cgroup should both tclone and CRIU die in
// between, and a timeout kills a CRIU that hangs.
func (e *Engine) dump(ctx context.Context, src *source, dir string, freezer *cgroups.Freezer, check *criucheck.Result, opts CaptureOptions, entry *journal.Entry, snapshot func(context.Context) (*rootfs.Snapshot, error)) (*dumped, error) {
	// One deadline for CRIU and for the snapshot it waits on.
	ctx, cancel := context.WithTimeout(ctx, e.criuTimeout())
	defer cancel()
	imagesDir, err := os.Open(plan.ImagesDir(dir))
	if err != nil {
		return nil, err
	}
	defer imagesDir.Close()
	workDir, err := os.Open(plan.WorkDir(dir))
	if err != nil {
		return nil, err
	}
	defer workDir.Close()
	selfCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	criuOpts, err := dumpOptions(dumpInput{
		spec: src.spec, pid: src.state.Pid, rootfs: src.status.Rootfs, freezerDir: freezer.Dir,
		imagesFd: int(imagesDir.Fd()), workFd: int(workDir.Fd()), opts: opts,
		selfCgroup: string(selfCgroup), unified: cgroups.Unified(),
	})
	if err != nil {
		return nil, err
	}
	// Best effort, before the freeze: a watch it cannot name is for CRIU
	// to refuse, and explainDumpError to explain.
	primeIrmap(plan.WorkDir(dir), src.state.Pid)

	guard, err := cgroups.StartGuard(freezer)
	if err != nil {
		return nil, err
	}
	defer guard.Done()

	var snap *rootfs.Snapshot
	var froze bool
	var freezeStart, frozenAt time.Time
	hooks := &criuhooks.CaptureHooks{
		OnPreDump: func(criuPid int) error {
			guard.Watch(criuPid)
			// On record before the freeze, so recovery knows this capture
			// may have left the source frozen.
			if err := entry.Update(func(r *journal.Record) { r.Phase = phaseFrozen }); err != nil {
				return err
			}
			// Freeze here, just before CRIU would: CRIU then finds the
			// cgroup frozen and seizes at once instead of polling the
			// freezer in 100 ms steps.
			freezeStart = time.Now()
			if err := freezer.Freeze(freezeTimeout); err != nil {
				freezer.Thaw()
				return err
			}
			froze, frozenAt = true, time.Now()
			crashPoint(CrashSourceFrozen)
			return nil
		},
		OnPostDump: func() error {
			var err error
			snap, err = snapshot(ctx)
			crashPoint(CrashSnapshotTaken)
			return err
		},
	}
	logPath := filepath.Join(plan.WorkDir(dir), dumpLogName)
	err = criuhooks.Dump(ctx, criuhooks.Request{
		CriuPath: check.Path, Env: check.Env(), Opts: criuOpts, LogPath: logPath,
		// The source must not wait for the snapshot hook to notice.
		OnTimeout: func() { freezer.Thaw() },
	}, hooks)
	// CRIU leaves the cgroup as it found it, frozen by us; and if CRIU died
	// while freezing, frozen by it. Either way the source runs again here.
	if _, terr := freezer.ThawIfFrozen(); terr != nil {
		err = errors.Join(err, terr)
	}
	thawed := time.Now()
	crashPoint(CrashDumpDone)
	if terr := entry.Update(func(r *journal.Record) { r.Phase = phaseDumped }); terr != nil {
		err = errors.Join(err, terr)
	}
	if err != nil {
		if snap != nil {
			snap.Remove()
		}
		// The plan directory goes; the log of the failed dump stays.
		var cerr *criuhooks.Error
		if errors.As(err, &cerr) {
			cerr.LogPath = keepLog(logPath, "dump", src.id)
		}
		return nil, explainDumpError(src.id, err)
	}
	if !froze {
		return nil, fmt.Errorf("capturing %s: CRIU finished without asking to freeze the tree", src.id)
	}
	if err := criuhooks.FixupDump(plan.ImagesDir(dir)); err != nil {
		snap.Remove()
		return nil, err
	}
	d := &dumped{snapshot: snap}
	d.timings.FreezeMs = ms(frozenAt.Sub(freezeStart))
	d.timings.DumpMs = ms(hooks.PostDumpAt.Sub(frozenAt))
	d.timings.SnapshotMs = ms(hooks.PostDumpDone.Sub(hooks.PostDumpAt))
	d.timings.ThawMs = ms(thawed.Sub(hooks.PostDumpDone))
	d.timings.SourcePauseMs = ms(thawed.Sub(freezeStart))
	if st, err := criuhooks.DumpStats(plan.WorkDir(dir)); err == nil {
		d.timings.CriuFrozenMs = float64(st.GetFrozenTime()) / 1000
		d.pages = plan.PageStats{
			PagesWritten: st.GetPagesWritten(),
			PagesSkipped: st.GetPagesSkippedParent(),
			BytesWritten: int64(st.GetPagesWritten()) * int64(os.Getpagesize()),
		}
	}
	return d, nil
}

// explainDumpError adds advice for CRIU refusals users can act on.
func explainDumpError(id string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "TCP") && strings.Contains(msg, "established"),
		strings.Contains(msg, "Connected TCP socket"):
		return fmt.Errorf("capturing %s: %w; a TCP connection was opened after tclone looked for one: fork again", id, err)
	case strings.Contains(msg, "file lock") || strings.Contains(msg, "flock"):
		return fmt.Errorf("capturing %s: %w; the container holds file locks: fork with --file-locks", id, err)
	case strings.Contains(msg, "Unsupported proto 262"):
		return fmt.Errorf("capturing %s: %w; a socket uses Multipath TCP, which CRIU cannot dump (Go 1.24 and later listen with it by default: run such servers with GODEBUG=multipathtcp=0)", id, err)
	case strings.Contains(msg, "Can't dump that handle"):
		return fmt.Errorf("capturing %s: %w; a process has an inotify or fanotify watch on a file without a name (deleted while still open, or moved while the fork began): on an overlay root CRIU cannot reopen a watched file by its handle, only find it by its path; end that watch (restart the watching program) before forking", id, err)
	case strings.Contains(msg, "external unix") || strings.Contains(msg, "unix socket"):
		return fmt.Errorf("capturing %s: %w; a unix socket connects outside the container: fork with --ext-unix-sk if its peer may be shared", id, err)
	}
	return fmt.Errorf("capturing %s: %w", id, err)
}

// summarizeTree reads the captured process tree from CRIU's images.
func summarizeTree(images string) (plan.Tree, error) {
	root, err := crit.New(nil, nil, images, false, true).ExplorePs()
	if err != nil {
		return plan.Tree{}, fmt.Errorf("reading the captured process tree: %w", err)
	}
	var t plan.Tree
	var walk func(ps *crit.PsTree)
	walk = func(ps *crit.PsTree) {
		threads := len(ps.Process.GetThreads())
		t.Processes++
		t.Threads += threads
		t.Tasks = append(t.Tasks, plan.Process{
			Pid: int(ps.PID), PPid: int(ps.Process.GetPpid()), Pgid: int(ps.PgID), Sid: int(ps.SID),
			Threads: threads, Comm: ps.Comm,
		})
		for _, c := range ps.Children {
			walk(c)
		}
	}
	if root != nil {
		walk(root)
	}
	return t, nil
}
