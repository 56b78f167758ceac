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
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/internal/ptracehold"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/runtime/rootfs"
)

// CaptureRequest asks for a fork plan of a running container.
type CaptureRequest struct {
	Source string
	// Fork is the capture's options and the plan's; Capture normalizes it.
	Fork forkopts.Fork
	// Client is the fork client the plan's uses are held for (see
	// plan.Uses.Client); nil for a plan kept until it expires.
	Client *journal.Owner
	// CallerPaused allows a source its caller paused for this capture
	// (plan.Intent.CallerPaused); it stays paused.
	CallerPaused bool
}

// Captured is a finished capture.
type Captured struct {
	Plan *plan.Plan
	Dir  string
}

// Capture is Phase A. CRIU seizes the source's whole tree with ptrace, dumps
// it leaving it running, and, while the tree is still seized, the root
// filesystem is snapshotted, so memory and files come from one instant. Page
// images go to the tmpfs plan store. On any failure nothing is left: no plan,
// no snapshot, and the source running.
//
// The source is never frozen: only CRIU's ptrace holds it, and the kernel
// lets the tree go the moment CRIU dies, whoever kills it. tclone kills CRIU
// when the capture timeout passes or the caller gives up.
func (e *Engine) Capture(ctx context.Context, req CaptureRequest) (*Captured, error) {
	src, err := e.prepare(ctx, req.Source, &req.Fork, req.CallerPaused)
	if err != nil {
		return nil, err
	}
	return e.captureSource(ctx, src, req)
}

// prepare normalizes a fork's options and loads its source, once recovery
// has run: an older capture that died may have left the source frozen,
// which would read as paused.
func (e *Engine) prepare(ctx context.Context, id string, f *forkopts.Fork, callerPaused bool) (*source, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	e.RecoverQuietly(ctx)
	return loadSource(ctx, e.Crun, id, callerPaused)
}

// captureOp is one capture in progress: the source it holds, and what it
// has made so far for the plan.
type captureOp struct {
	e     *Engine
	src   *source
	req   CaptureRequest
	check *criucheck.Result
	rfs   rootfs.Source
	// id and dir are the plan's; snapDir is where the root snapshot goes.
	id, dir, snapDir string
	// vols are the volumes to copy; volumes their copies, once taken.
	vols    []volumeToCopy
	volumes []plan.Volume
	// memory is the plan's memory mode (forkopts.Memory.Capture); held,
	// for a copy-on-write capture (cow, twin), its memory in the making.
	memory forkopts.Memory
	held   heldMemory
	entry  *journal.Entry
	log    *opLog
}

// captureSource is Capture of a source already loaded and checked, after
// recovery, with options normalized.
func (e *Engine) captureSource(ctx context.Context, src *source, req CaptureRequest) (*Captured, error) {
	start := time.Now()
	check, err := e.CheckCriu(ctx)
	if err != nil {
		return nil, err
	}
	unlock, err := e.lockSource(ctx, src.id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Memory a files-only fork does not take may be incomplete; nor does
	// it run CRIU.
	memory, why := req.Fork.Memory, ""
	var twin twinHost
	if !req.Fork.FilesOnly {
		// The waits come first: a sibling still filling has its memory
		// registered with a userfaultfd, which twins cannot take, until
		// its daemon is done.
		if err := checkDumpableCredentials(src.state.Pid); err != nil {
			return nil, err
		}
		if err := e.waitMemoryComplete(ctx, src, req.Fork.CaptureTimeout); err != nil {
			return nil, err
		}
		if err := waitTwinsGone(ctx, src, req.Fork.CaptureTimeout); err != nil {
			return nil, err
		}
		var host forkopts.CaptureHost
		host.Cow, host.CowWhy = cowAvailable(check)
		if req.Fork.Durable && host.Cow {
			host.Cow, host.CowWhy = false, "a branch keeps page images, which module snapshots are not"
		}
		twin, host.Twin, host.TwinWhy = twinAvailable(check)
		if host.Twin {
			if fits, why := twinFits(ctx, src, e.trackDir()); !fits {
				host.Twin, host.TwinWhy = false, why
			}
		}
		if host.Twin && src.paused {
			// CRIU leaves a source its caller froze frozen, twins and all:
			// a twin that must be ended (a failed capture) or reaped (its
			// drain is done) could not be until the caller thaws it, and
			// the caller waits for this capture first.
			host.Twin, host.TwinWhy = false, "the source is paused by the checkpoint's caller (containerd's CRI checkpoint), and a twin's end needs it running"
		}
		if memory, why, err = req.Fork.Memory.Capture(host); err != nil {
			return nil, err
		}
	}
	p, op, err := e.captureAs(ctx, src, req, check, memory, twin, why)
	var unfit *notTwinnable
	if err != nil && memory == forkopts.MemoryTwin && (req.Fork.Memory == "" || req.Fork.Memory == forkopts.MemoryAuto) && errors.As(err, &unfit) {
		// auto took twins, and the source turned out to hold memory
		// they cannot: it is captured again, its pages copied.
		p, op, err = e.captureAs(ctx, src, req, check, "", twin, fmt.Sprintf("captured again, pages copied while the source is held: %v", unfit.err))
	}
	if err != nil {
		return nil, err
	}
	p.Timings.TotalMs = ms(time.Since(start))
	if err := p.Write(op.dir); err != nil {
		return op.fail(fmt.Errorf("writing plan: %w", err))
	}
	if err := plan.SetUses(op.dir, req.Fork.Uses, req.Client); err != nil {
		return op.fail(fmt.Errorf("writing plan uses: %w", err))
	}
	op.log.phase("plan", logrus.Fields{"processes": p.Tree.Processes, "threads": p.Tree.Threads})
	return &Captured{Plan: p, Dir: op.dir}, op.entry.End()
}

// captureAs makes one capture of the locked source, its memory taken as
// memory says (why, for the log): the plan not written yet.
func (e *Engine) captureAs(ctx context.Context, src *source, req CaptureRequest, check *criucheck.Result, memory forkopts.Memory, twin twinHost, why string) (*plan.Plan, *captureOp, error) {
	op, err := e.beginCapture(src, req, check)
	if err != nil {
		return nil, nil, err
	}
	op.memory = memory
	switch memory {
	case forkopts.MemoryCow:
		op.held = &cowCapture{criu: externalCRIU(check)}
	case forkopts.MemoryTwin:
		tc := &twinCapture{host: twin, images: plan.ImagesDir(op.dir), branches: req.Fork.BranchStore,
			source: op.src.id, procs: cgroups.ProcsDir(op.src.status.CgroupPath)}
		if tc.branches == "" {
			tc.branches = e.Store.Branches
		}
		if req.Fork.Durable && trackingAvailable(check) {
			tc.track = &trackRequest{e: e, source: src.id, gen: op.id}
		}
		op.held = tc
	}
	if !req.Fork.FilesOnly {
		logrus.WithFields(logrus.Fields{"source": src.id, "asked": req.Fork.Memory, "memory": memory}).Infof("memory: %s", why)
	}
	crashPoint(CrashCaptureStarted)
	capture := op.capture
	if req.Fork.FilesOnly {
		capture = op.captureFiles
	}
	p, err := capture(ctx)
	if err != nil {
		_, err = op.fail(err)
		return nil, nil, err
	}
	if op.held != nil {
		if err := op.holdSnapshots(ctx, p); err != nil {
			_, err = op.fail(err)
			return nil, nil, err
		}
		crashPoint(CrashSnapshotsHeld)
	}
	return p, op, nil
}

// beginCapture makes the plan's directory and records the capture in the
// journal, before anything of the source is touched.
func (e *Engine) beginCapture(src *source, req CaptureRequest, check *criucheck.Result) (*captureOp, error) {
	rfs, err := rootfs.Detect(src.status.Rootfs)
	if err != nil {
		return nil, err
	}
	refs, err := sourceRefs(src, req.Fork.TCP)
	if err != nil {
		return nil, err
	}
	vols, err := captureVolumes(src, req.Fork.Volumes)
	if err != nil {
		return nil, err
	}
	// The journal names the plan's directory before it exists: a capture
	// killed in between leaves an entry that recovery ends, never a
	// directory nothing names.
	id := plan.NewID()
	dir := e.Store.Dir(id)
	op := &captureOp{e: e, src: src, req: req, check: check, rfs: rfs, id: id, dir: dir,
		snapDir: rootfs.SnapshotDir(rfs, e.Store.SnapshotRoot, id), vols: vols, log: newOpLog("capture", src.id)}
	op.entry, err = e.journal().Begin(journal.Record{
		Kind: journal.Capture, Phase: journal.CaptureDump, PlanDir: dir, CrunRoot: e.Crun.Global.Root,
		Capture: &journal.CaptureRecord{
			SourceID: src.id, Source: refs,
			SnapshotKind: string(rfs.Kind), SnapshotPath: op.snapDir,
		},
	})
	if err != nil {
		return nil, err
	}
	if _, err := e.Store.CreateDir(id); err != nil {
		op.entry.End()
		return nil, err
	}
	op.log.phase("prepare", logrus.Fields{"plan": dir, "rootfs": rfs.Kind, "options": req.Fork, "criu": check.Version})
	if rfs.Kind == rootfs.KindBtrfs {
		if err := e.Store.RecordExternalSnapshot(id, op.snapDir); err != nil {
			e.Store.Remove(dir)
			op.entry.End()
			return nil, fmt.Errorf("recording where the snapshot goes: %w", err)
		}
	}
	return op, nil
}

// fail undoes the capture: the snapshot and the plan go. An entry whose
// source may still be held stays for recovery (tclone gc) to finish; it
// says what is left to undo.
func (op *captureOp) fail(err error) (*Captured, error) {
	op.log.failed(err)
	if op.held != nil {
		op.held.release()
	}
	snap := rootfs.Snapshot{Kind: op.rfs.Kind, Path: op.snapDir}
	err = errors.Join(err, snap.Remove(), op.e.Store.Remove(op.dir))
	var held *sourceHeldError
	if !errors.As(err, &held) {
		op.entry.End()
	}
	return nil, err
}

// capture dumps the source and the root filesystem, and describes the
// result as a plan.
func (op *captureOp) capture(ctx context.Context) (*plan.Plan, error) {
	src, req := op.src, op.req
	images := plan.ImagesDir(op.dir)
	if err := os.WriteFile(filepath.Join(images, descriptorsFile), []byte(src.status.ExternalDescriptors), 0o600); err != nil {
		return nil, fmt.Errorf("saving the source's stdio descriptors: %w", err)
	}
	netDir := fmt.Sprintf("/proc/%d/net", src.state.Pid)
	opts, err := req.Fork.Capture.Dump(func() (bool, error) { return hasConnectedTCP(netDir) })
	if err != nil {
		return nil, err
	}
	d, err := op.dump(ctx, opts)
	if err != nil {
		return nil, err
	}
	p := op.newPlan(d.snapshot, d.timings)
	p.Capture, p.Memory, p.Pages, p.Criu = opts, op.memory, d.pages, op.check.Version.String()
	if path, ok := namespacePath(src.spec, "network"); ok {
		p.Source.NetNSPath = path
	}
	// Unknown (0) only ever refuses a sibling that would keep connections.
	p.Source.NetNSInode, _ = netNSInode(src.state.Pid)
	tree, err := summarizeTree(images)
	if err != nil {
		d.snapshot.Remove()
		return nil, err
	}
	p.Tree = tree
	return p, nil
}

// captureFiles is a files-only fork's capture: the root filesystem and the
// volumes, taken while every task of the source is held still with ptrace
// (the kernel lets them go should this process die), without CRIU.
func (op *captureOp) captureFiles(ctx context.Context) (*plan.Plan, error) {
	src, req := op.src, op.req
	ctx, cancel := context.WithTimeout(ctx, req.Fork.CaptureTimeout)
	defer cancel()
	procs := cgroups.ProcsDir(src.status.CgroupPath)
	start := time.Now()
	hold, err := ptracehold.Stop(ctx, func() ([]int, error) { return cgroups.Procs(procs) })
	if err != nil {
		return nil, fmt.Errorf("capturing the files of %s: holding its processes still: %w", src.id, err)
	}
	held := time.Now()
	snap, err := rootfs.Take(ctx, op.rfs, op.snapDir)
	if err == nil {
		op.volumes, err = copyVolumes(ctx, op.vols, op.e.Store.VolumesDir(op.id))
	}
	taken := time.Now()
	err = errors.Join(err, hold.Release())
	released := time.Now()
	if err != nil {
		if snap != nil {
			snap.Remove()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("capturing the files of %s: %w; the source runs on: a large root filesystem needs a longer --capture-timeout", src.id, err)
		}
		return nil, fmt.Errorf("capturing the files of %s: %w", src.id, err)
	}
	op.log.phase("files", logrus.Fields{"tasks": hold.Tasks, "source_pause_ms": ms(released.Sub(start))})
	p := op.newPlan(snap, plan.Timings{
		FreezeMs: ms(held.Sub(start)), SnapshotMs: ms(taken.Sub(held)), ThawMs: ms(released.Sub(taken)),
		SourcePauseMs: ms(released.Sub(start)),
	})
	p.FilesOnly = true
	return p, nil
}

// newPlan is what every capture's plan holds: the source, its files and
// the fork's options.
func (op *captureOp) newPlan(snap *rootfs.Snapshot, timings plan.Timings) *plan.Plan {
	src, req := op.src, op.req
	return &plan.Plan{
		Version:   plan.FormatVersion,
		ID:        op.id,
		CreatedAt: time.Now().UTC(),
		ExpiresAt: time.Now().Add(req.Fork.TTL).UTC(),
		Source: plan.Source{
			ID: src.id, Bundle: src.state.Bundle, Rootfs: src.status.Rootfs, Pid: src.state.Pid,
			CgroupPath: src.status.CgroupPath, Hostname: src.spec.Hostname, CrunRoot: op.e.Crun.Global.Root,
		},
		Rootfs:   snap,
		Volumes:  op.volumes,
		Identity: req.Fork.Identity,
		TCP:      req.Fork.TCP,
		Timings:  timings,
	}
}

type dumped struct {
	snapshot *rootfs.Snapshot
	timings  plan.Timings
	pages    plan.PageStats
}

// dump runs CRIU. The source is held only inside this call, by CRIU's ptrace:
// CRIU seizes the tree after its pre-dump notification, calls post-dump (the
// snapshot) and lets the tree go before it returns. The call is bounded by
// the capture timeout and by ctx; either kills CRIU, and the kernel releases
// the tree at once.
func (op *captureOp) dump(ctx context.Context, opts forkopts.Dumped) (*dumped, error) {
	src, dir, entry, timeout := op.src, op.dir, op.entry, op.req.Fork.CaptureTimeout
	// One deadline for CRIU and for the snapshot it waits on.
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	criuOpts, closeDirs, err := captureOptions(src, dir, opts)
	if err != nil {
		return nil, err
	}
	defer closeDirs()
	var setup dumpSetup
	build := installedBuild(op.check)
	build.keepKerndat()
	conf := build.dumpConf(opts)
	if op.held != nil {
		if setup, err = op.held.begin(criuOpts, plan.WorkDir(dir), conf); err != nil {
			return nil, err
		}
		defer op.held.dumpDone()
	} else if conf != nil {
		end, err := criuhooks.Configure(criuOpts, plan.WorkDir(dir), conf)
		if err != nil {
			return nil, err
		}
		defer end()
		setup.criuPath = build.Path
	}
	// Best effort, before CRIU seizes the tree: a watch it cannot name is
	// for CRIU to refuse, and explainDumpError to explain.
	primeIrmap(plan.WorkDir(dir), src.state.Pid)

	op.log.phase("criu-options", logrus.Fields{"criu_opts": criuOpts, "criu_conf": conf, "timeout": timeout})
	hooks := newCaptureNotify(ctx, src, entry, func(ctx context.Context) (*rootfs.Snapshot, error) {
		snap, err := rootfs.Take(ctx, op.rfs, op.snapDir)
		if err == nil {
			// The plan's removal removes them, whatever fails later.
			op.volumes, err = copyVolumes(ctx, op.vols, op.e.Store.VolumesDir(op.id))
		}
		if err == nil && op.held != nil {
			// Last, so that a failure above takes none.
			err = op.held.take(src.state.Pid)
		}
		return snap, err
	})
	hooks.lockSkipped = criuOpts.GetNetworkLock() == rpc.CriuNetworkLockMethod_SKIP
	logPath := filepath.Join(plan.WorkDir(dir), dumpLogName)
	criuPath := op.check.Path
	if setup.criuPath != "" {
		criuPath = setup.criuPath
	}
	hooks.onCriuStarted = setup.started
	err = criuhooks.Dump(ctx, criuhooks.Request{
		CriuPath: criuPath, Env: append(op.check.Env(), setup.env...), Opts: criuOpts, LogPath: logPath,
	}, hooks)
	// Why the plugin made the dump fail comes first (joined below, once
	// the error names where the log is kept).
	var heldErr error
	if err != nil && op.held != nil {
		heldErr = op.held.dumpErr()
	}
	returned := time.Now()
	crashPoint(CrashDumpDone)
	// CRIU that returned has let the tree go; one that was killed could not
	// undo its network lock or the repair mode of the connections.
	if rerr := op.e.releaseSource(entry.Rec, err != nil); rerr != nil {
		err = errors.Join(err, rerr)
	} else if uerr := entry.Update(func(r *journal.Record) { r.Phase = journal.CaptureDumped; r.Capture.Criu = nil }); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if err == nil && op.held != nil {
		err = op.held.adopt(src.state.Pid)
	}
	snap := hooks.snap
	if err != nil {
		if snap != nil {
			snap.Remove()
		}
		// The plan directory goes; the log of the failed dump stays.
		var cerr *criuhooks.Error
		if errors.As(err, &cerr) {
			cerr.LogPath = op.e.keepLog(logPath, "dump", src.id)
		}
		if heldErr != nil {
			err = fmt.Errorf("%w: %w", heldErr, err)
		}
		return nil, explainDumpError(src.id, err, timeout)
	}
	if hooks.seizeStart.IsZero() {
		if snap != nil {
			snap.Remove()
		}
		return nil, fmt.Errorf("capturing %s: CRIU finished without announcing the dump", src.id)
	}
	if err := criuhooks.FixupDump(plan.ImagesDir(dir)); err != nil {
		snap.Remove()
		return nil, err
	}
	pages := dumpPages(dir, hooks)
	timings := pauseTimings(hooks, returned)
	op.log.phase("dump", logrus.Fields{
		"source_pause_ms": timings.SourcePauseMs, "seize_ms": timings.FreezeMs, "criu_dump_ms": timings.DumpMs,
		"snapshot_ms": timings.SnapshotMs, "release_ms": timings.ThawMs, "pages_written": pages.PagesWritten,
	})
	return &dumped{snapshot: snap, timings: timings, pages: pages}, nil
}

// dumpPages reads CRIU's statistics: the pages it wrote, and how long it
// took to seize the tree, which pauseTimings counted in DumpMs.
func dumpPages(dir string, h *captureNotify) plan.PageStats {
	st, err := criuhooks.DumpStats(plan.WorkDir(dir))
	if err != nil {
		return plan.PageStats{}
	}
	h.seizeMs = float64(st.GetFreezingTime()) / 1000
	h.criuHeldMs = float64(st.GetFrozenTime()) / 1000
	return plan.PageStats{
		PagesWritten: st.GetPagesWritten(),
		PagesSkipped: st.GetPagesSkippedParent(),
		BytesWritten: int64(st.GetPagesWritten()) * int64(os.Getpagesize()),
	}
}

// pauseTimings splits the source's pause, from CRIU's pre-dump notification
// (just before it seizes the tree) to the tree running again: seizing
// (CRIU's own figure), dumping, the post-dump hook, letting go. The tree
// runs again at CRIU's dump-resumed notification; a CRIU that sends none
// (a stock one) is taken to let it go only when it returns, which counts
// its clean-up and its exit in the pause.
func pauseTimings(h *captureNotify, returned time.Time) plan.Timings {
	resumed := returned
	if !h.ResumedAt.IsZero() && h.ResumedAt.Before(returned) {
		resumed = h.ResumedAt
	}
	dump := ms(h.PostDumpAt.Sub(h.seizeStart))
	return plan.Timings{
		FreezeMs:      h.seizeMs,
		DumpMs:        max(0, dump-h.seizeMs),
		SnapshotMs:    ms(h.PostDumpDone.Sub(h.PostDumpAt)),
		ThawMs:        ms(resumed.Sub(h.PostDumpDone)),
		SourcePauseMs: ms(resumed.Sub(h.seizeStart)),
		CriuFrozenMs:  h.criuHeldMs,
	}
}

// captureOptions opens the plan's image and work directories for CRIU and
// builds the dump options; closeDirs closes them once CRIU is done.
func captureOptions(src *source, dir string, opts forkopts.Dumped) (_ *rpc.CriuOpts, closeDirs func(), err error) {
	imagesDir, err := os.Open(plan.ImagesDir(dir))
	if err != nil {
		return nil, nil, err
	}
	workDir, err := os.Open(plan.WorkDir(dir))
	if err != nil {
		imagesDir.Close()
		return nil, nil, err
	}
	// The source's hierarchies as they are mounted here, so that CRIU
	// mounts none of them while it holds the tree (cgroups.Yard). It goes
	// with CRIU: a plan holds regular files only.
	yard := filepath.Join(plan.WorkDir(dir), "cgroup-yard")
	closeDirs = func() { imagesDir.Close(); workDir.Close(); os.RemoveAll(yard) }
	selfCgroups, err := procfs.SelfCgroups()
	if err != nil {
		closeDirs()
		return nil, nil, err
	}
	criuOpts, err := dumpOptions(dumpInput{
		spec: src.spec, pid: src.state.Pid, rootfs: src.status.Rootfs,
		imagesFd: int(imagesDir.Fd()), workFd: int(workDir.Fd()), opts: opts,
		selfCgroups: selfCgroups, unified: cgroups.Unified(),
		freezeCgroup: src.frozenBy(),
	})
	if err != nil {
		closeDirs()
		return nil, nil, err
	}
	if err := cgroups.Yard(yard, src.state.Pid); err != nil {
		logrus.Debugf("capture: CRIU mounts the cgroup hierarchies itself: %v", err)
	} else {
		criuOpts.CgroupYard = proto.String(yard)
	}
	return criuOpts, closeDirs, nil
}

// captureNotify is the capture's side of CRIU's notifications: it records
// the CRIU process and its network lock in the journal before CRIU seizes
// and locks, and takes the snapshot in post-dump.
type captureNotify struct {
	criuhooks.CaptureHooks
	entry *journal.Entry
	snap  *rootfs.Snapshot

	// lockSkipped says CRIU was told not to lock the source's network: it
	// still announces the lock, and then takes none.
	lockSkipped bool
	// onCriuStarted, if set, runs in pre-dump, once CRIU runs.
	onCriuStarted func()

	criuPid    int
	seizeStart time.Time
	// From CRIU's statistics, once it returned.
	seizeMs, criuHeldMs float64
}

func newCaptureNotify(ctx context.Context, src *source, entry *journal.Entry, snapshot func(context.Context) (*rootfs.Snapshot, error)) *captureNotify {
	n := &captureNotify{entry: entry}
	n.OnPreDump = func(criuPid int) error {
		// On record before CRIU seizes anything, so recovery knows which
		// CRIU to end should tclone die with CRIU still holding the tree.
		criu, ok := journal.OwnerOf(criuPid)
		if !ok {
			return fmt.Errorf("the criu process %d ended before it seized %s", criuPid, src.id)
		}
		if err := entry.Update(func(r *journal.Record) { r.Phase = journal.CaptureSeized; r.Capture.Criu = &criu }); err != nil {
			return err
		}
		n.seizeStart, n.criuPid = time.Now(), criuPid
		if n.onCriuStarted != nil {
			n.onCriuStarted()
		}
		crashWhenSeized(src.state.Pid, criuPid)
		return nil
	}
	n.OnPostDump = func() error {
		var err error
		n.snap, err = snapshot(ctx)
		crashPoint(CrashSnapshotTaken)
		crashWithCriu(n.criuPid)
		return err
	}
	return n
}

// NetworkLock implements criu.Notify; CRIU calls it just before it locks the
// source's network namespace. Only a lock CRIU takes is recorded, for
// releaseSource to look for: one skipped leaves nothing to remove, and
// looking costs seven iptables and nft runs before the first sibling can
// be restored.
func (n *captureNotify) NetworkLock() error {
	if n.lockSkipped {
		return nil
	}
	return n.entry.Update(func(r *journal.Record) {
		if r.Capture.Source != nil {
			r.Capture.Source.NetworkLocked = true
		}
	})
}

// CriuStarted moves the capture's CRIU out of the caller's cgroup, into
// tclone's keeper cgroup, before CRIU is asked anything: a kill of the
// caller's whole cgroup (a service manager stopping Podman, an OOM kill of
// the group) then ends tclone but not CRIU. That matters to the source:
// where tclone's CRIU cannot run its calls in the source's tasks the
// kill-safe way (compel-safe-calls.patch: a task that blocks both of the
// signals it stops with, a 32-bit one, a vDSO with no room), they end in a
// breakpoint (compel's "syscall; int3"), and a CRIU killed while one is in
// flight leaves the task to take that SIGTRAP with no tracer, which kills
// it; and a CRIU killed while its parasite runs in a task of several
// threads leaves the parasite's blob mapped in the task. A CRIU whose
// tclone died instead fails at its next message
// to tclone (it ignores SIGPIPE) and undoes its dump on its own: its
// parasites return and are unmapped, its tasks run on. Recovery waits for
// that (endProcess).
func (n *captureNotify) CriuStarted(pid int) {
	n.CaptureHooks.CriuStarted(pid)
	if err := cgroups.Escape(pid); err != nil {
		logrus.Warnf("capture: CRIU stays in the caller's cgroup, where a kill of the cgroup would end it midway: %v", err)
	}
}

// explainDumpError adds advice for CRIU refusals users can act on.
func explainDumpError(id string, err error, timeout time.Duration) error {
	msg := err.Error()
	var held *sourceHeldError
	var noTwin *criuhooks.TwinError
	switch {
	case errors.As(err, &held):
		return fmt.Errorf("capturing %s: %w", id, err)
	case errors.As(err, &noTwin):
		return fmt.Errorf("capturing %s: %w; the source runs on: fork again, or with --memory copy or lazy, which make no twins", id, err)
	case errors.Is(err, criuhooks.ErrTimeout):
		return fmt.Errorf("capturing %s: %w; CRIU was stopped after %s and the source runs on: a large workspace needs a longer --capture-timeout", id, err, timeout)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("capturing %s: cancelled; CRIU was stopped and the source runs on: %w", id, err)
	case strings.Contains(msg, "TCP") && strings.Contains(msg, "established"),
		strings.Contains(msg, "Connected TCP socket"):
		return fmt.Errorf("capturing %s: %w; a TCP connection was opened after tclone looked for one: fork again", id, err)
	case strings.Contains(msg, "file lock") || strings.Contains(msg, "flock"):
		return fmt.Errorf("capturing %s: %w; the container holds file locks: fork with --file-locks", id, err)
	case strings.Contains(msg, "Unsupported proto 262"):
		return fmt.Errorf("capturing %s: %w; a socket uses Multipath TCP, which CRIU cannot dump (Go 1.24 and later listen with it by default: run such servers with GODEBUG=multipathtcp=0)", id, err)
	case strings.Contains(msg, "Can't dump that handle"):
		return fmt.Errorf("capturing %s: %w; a process has an inotify or fanotify watch on a file without a name (deleted while still open, or moved while the fork began): on an overlay root CRIU cannot reopen a watched file by its handle, only find it by its path; end that watch (restart the watching program) before forking", id, err)
	case strings.Contains(msg, "Unseizable non-zombie"):
		return fmt.Errorf("capturing %s: %w; %s", id, err, unseizable(msg))
	case strings.Contains(msg, "Can't dump ghost file"):
		return fmt.Errorf("capturing %s: %w; a process holds open a deleted file (a temporary file) larger than the ghost limit: fork with a larger --ghost-limit (the file is copied while the source is held), or have the program close it", id, err)
	case strings.Contains(msg, "external unix") || strings.Contains(msg, "unix socket"):
		return fmt.Errorf("capturing %s: %w; a unix socket connects outside the container: fork with --ext-unix-sk if its peer may be shared", id, err)
	}
	return fmt.Errorf("capturing %s: %w", id, err)
}

// unseizable says why CRIU could not seize the process its error names: a
// process another one traces (a debugger, strace) cannot be traced by CRIU
// too.
func unseizable(msg string) string {
	const what = "a process of the container could not be seized: fork again; if it fails again, a debugger (gdb, strace) is likely attached to one of its processes, and the fork must wait until it detaches"
	var pid int
	i := strings.Index(msg, "Unseizable non-zombie ")
	if _, err := fmt.Sscan(msg[i+len("Unseizable non-zombie "):], &pid); err != nil || pid <= 0 {
		return what
	}
	st, err := procfs.ReadStatus(pid)
	if err != nil || st.TracerPid == 0 {
		return what
	}
	tracer := "process " + fmt.Sprint(st.TracerPid)
	if ts, err := procfs.ReadStatus(st.TracerPid); err == nil {
		tracer = fmt.Sprintf("%s (%s)", tracer, ts.Name)
	}
	return fmt.Sprintf("process %d (%s) is traced by %s, a debugger or tracer, and CRIU cannot trace it too: detach it (quit the debugger, stop strace) and fork again", pid, st.Name, tracer)
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
