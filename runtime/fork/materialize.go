package fork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/ksm"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
)

// MaterializeRequest builds one sibling from a plan. The fields mirror
// `crun restore`, which conmon calls.
type MaterializeRequest struct {
	Plan   string // plan ID or directory
	ID     string // the sibling's container ID
	Bundle string // the sibling's bundle; its config.json decides everything sibling-specific

	Detach        bool
	PidFile       string
	ConsoleSocket string
	WorkPath      string

	// TCP is what the sibling does with its copies of the source's
	// established TCP connections: close whatever the plan says, keep
	// (only a plan captured for keeping them allows it; see
	// siblingTCPPolicy), or "" for the plan's policy.
	TCP forkopts.TCPPolicy
	// Memory is how the sibling gets its memory; "" means the plan's
	// choice (lazy where the host can).
	Memory forkopts.Memory
	// Pass-through crun restore options.
	ManageCgroupsMode string
	LSMProfile        string
	LSMMountContext   string

	// Stdio of the sibling when it is not detached, and of crun.
	Stdin          io.Reader
	Stdout, Stderr io.Writer

	// ownsPlan marks a plan made for this sibling alone (Fork): recovery
	// removes it with the sibling.
	ownsPlan bool
}

// Materialized reports a sibling that is up.
type Materialized struct {
	ID       string       `json:"id"`
	PlanID   string       `json:"plan_id"`
	Hostname string       `json:"hostname,omitempty"`
	Rootfs   rootfs.Stats `json:"rootfs"`
	Timings  struct {
		RootfsMs  float64 `json:"rootfs_ms"`
		RestoreMs float64 `json:"restore_ms"`
		// CriuRestoreMs is CRIU's own restore time from its stats.
		CriuRestoreMs float64 `json:"criu_restore_ms"`
		TotalMs       float64 `json:"total_ms"`
		// MemoryCompleteMs is when, from the start of the
		// materialisation, every task of the sibling had all of its
		// memory; set by WaitMemory.
		MemoryCompleteMs float64 `json:"memory_complete_ms,omitempty"`
	} `json:"timings"`
	PagesRestored uint64 `json:"pages_restored"`
	// Volumes are the source's volumes copied into the sibling's own
	// (Snapshot is the sibling's directory).
	Volumes []plan.Volume `json:"volumes,omitempty"`
	// Memory is how the sibling got its memory. A lazy sibling runs while
	// it still receives it; MemoryComplete waits for the end.
	Memory forkopts.Memory `json:"memory"`
	// Merge says the sibling is mergeable as a whole (--memory ksm).
	Merge bool `json:"merge,omitempty"`
	// Share is what the share of a copy-on-write plan's snapshots did
	// (--memory cow): areas whose pages the sibling maps, and those
	// copied instead.
	Share *lazy.ShareResult `json:"share,omitempty"`

	// reported ends the operation; see Reported.
	reported func() error
	// start is when the materialisation started.
	start time.Time
}

// Reported ends a materialisation whose caller is about to report the
// sibling made: tclone calls it just before it exits with status 0, which
// is the report conmon, Podman and a `tclone fork` caller act on. Until
// then the operation stays in the journal and the watchdog stays on it, so
// that a tclone killed after the restore but before its exit (its caller
// then sees a failure) has its sibling undone like any unfinished one: a
// sibling left running after its runtime failed holds conmon's stdout
// pipe, and conmon, reading the runtime's error from it, would wait
// forever with Podman's container lock held. When Reported fails, the
// sibling is undone when this process exits.
func (m *Materialized) Reported() error {
	if m == nil || m.reported == nil {
		return nil
	}
	err := m.reported()
	m.reported = nil
	return err
}

// Materialize is Phase B: a sibling container from a plan. The sibling gets
// its own pid, mount, uts, ipc and cgroup namespaces, the network namespace
// its config names (or a private copy of the source's), its own hostname and
// cgroup, the source's external bind mounts remapped to its own, and its
// stdio and terminal connected to the caller. crun performs the restore, so
// crun's state for the sibling is ordinary: state, kill, delete, ps, exec and
// pause work on it as on any container. On failure nothing of the sibling is
// left behind and the plan's use is given back.
func (e *Engine) Materialize(ctx context.Context, req MaterializeRequest) (*Materialized, error) {
	start := time.Now()
	sib, err := e.checkSibling(req)
	if err != nil {
		return nil, err
	}
	e.RecoverQuietly(ctx)
	dir, err := e.Store.Resolve(req.Plan)
	if err != nil {
		return nil, err
	}
	p, err := plan.Read(dir)
	if err != nil {
		return nil, err
	}
	op, err := e.prepareMaterialize(ctx, req, sib, dir, p)
	if err != nil {
		return nil, err
	}
	m, err := op.run(ctx)
	if err != nil {
		return nil, op.fail(ctx, err)
	}
	os.RemoveAll(op.siblingDir)
	m.start = start
	m.Timings.TotalMs = ms(time.Since(start))
	// The use, the entry and the watchdog are let go when the sibling is
	// reported, not before.
	m.reported = op.reported
	return m, nil
}

// prepareMaterialize checks what only the plan can tell about the sibling,
// takes a use of the plan, records the operation in the journal and starts
// its watchdog.
func (e *Engine) prepareMaterialize(ctx context.Context, req MaterializeRequest, sib *sibling, dir string, p *plan.Plan) (*materializeOp, error) {
	spec := sib.spec
	if err := p.CheckMemory(); err != nil {
		return nil, err
	}
	if p.Source.NetNSPath != "" {
		if path, _ := namespacePath(spec, "network"); path == "" {
			return nil, fmt.Errorf("the source joined network namespace %s by path, so the sibling's config.json must name a network namespace path too (Podman does this); create one (ip netns add NAME) and set linux.namespaces[network].path", p.Source.NetNSPath)
		}
	}
	op := &materializeOp{e: e, req: req, p: p, dir: dir, sib: sib, root: rootPath(sib.bundle, spec), siblingDir: e.Store.SiblingDir(req.ID),
		log: newOpLog("materialize", req.ID)}
	var err error
	if op.tcp, err = siblingTCPPolicy(p, req, spec); err != nil {
		return nil, err
	}
	// Refuse a root, or volumes, not ours to fill before making anything:
	// undoing a failed sibling empties them.
	if _, err := p.Rootfs.CheckTarget(op.root); err != nil {
		return nil, err
	}
	if op.volumes, err = siblingVolumes(p, spec, sib.bundle); err != nil {
		return nil, err
	}
	if op.check, err = e.CheckCriu(ctx); err != nil {
		return nil, err
	}
	asked := req.Memory
	if asked == "" {
		asked = p.Memory
	}
	if asked == forkopts.MemoryTwin && p.Memory == forkopts.MemoryTwin {
		// A twin plan's siblings get copies of its pages, as lazy ones.
		asked = forkopts.MemoryLazy
	}
	// A files-only sibling has nothing of the source's memory: it starts
	// afresh.
	if !p.FilesOnly {
		if op.planned, err = e.plannedMemory(ctx, p, dir, asked); err != nil {
			return nil, err
		}
		if op.memory, err = asked.Resolve(op.planned, op.check.LazyPages, op.check.NoLazyPages); err != nil {
			return nil, err
		}
		if op.merge = asked == forkopts.MemoryKSM; op.merge {
			if err := ksm.Available(); err != nil {
				return nil, fmt.Errorf("--memory ksm: %w; fork with --memory lazy or copy", err)
			}
		}
	}
	if asked == "" && op.memory == forkopts.MemoryCopy {
		logrus.Debugf("memory is copied before sibling %s runs: %s", req.ID, op.check.NoLazyPages)
	}
	if op.lease, err = e.Store.Acquire(dir); err != nil {
		return nil, err
	}
	op.entry, err = e.journal().Begin(journal.Record{
		Kind: journal.Materialize, Phase: journal.MaterializePrepare, PlanDir: dir, CrunRoot: e.Crun.Global.Root,
		Materialize: &journal.MaterializeRecord{
			SiblingID: req.ID, RootTarget: op.root, ImagesOverlay: op.siblingDir,
			SiblingCgroup: spec.Linux.CgroupsPath, OwnsPlan: req.ownsPlan,
		},
	})
	if err != nil {
		op.lease.Release(false)
		return nil, err
	}
	if op.watch, err = e.startRestoreWatch(op.entry, req.Stderr); err != nil {
		op.lease.Release(false)
		op.entry.End()
		return nil, err
	}
	op.log.phase("prepare", logrus.Fields{"plan": dir, "bundle": sib.bundle, "root": op.root, "tcp": op.tcp, "memory": op.memory, "identity": p.Identity})
	return op, nil
}

// fail undoes what the operation made, gives the plan's use back and lets
// the watchdog go.
func (op *materializeOp) fail(ctx context.Context, err error) error {
	op.log.failed(err)
	err = errors.Join(err, op.e.undoMaterialize(ctx, op.entry.Rec))
	op.lease.Release(false)
	op.entry.End()
	op.watch.Done()
	return err
}

// reported ends the operation once the sibling is reported: see
// Materialized.Reported. When it fails, the entry and the watchdog stay,
// and the sibling is undone when this process exits.
func (op *materializeOp) reported() error {
	crashPoint(CrashBeforeReport)
	// The watchdog keeps the record from here on: should this process die
	// after the entry is gone and before the watchdog is released, Podman
	// sees a failed runtime, and the watchdog still knows what to undo.
	if err := op.watch.Reporting(op.entry.Rec); err != nil {
		// The watchdog is gone (the write can only fail so), and with it
		// nothing it could undo: failing here would leave the sibling to
		// nobody. The sibling is reported as before.
		logrus.Warnf("sibling %s: the restore watchdog is gone: %v", op.req.ID, err)
	}
	if err := op.lease.Release(true); err != nil {
		return fmt.Errorf("sibling %s was restored, but recording the plan's use failed: %w; it is removed again", op.req.ID, err)
	}
	if err := op.entry.End(); err != nil {
		return fmt.Errorf("sibling %s was restored, but ending its journal entry failed: %w; it is removed again", op.req.ID, err)
	}
	crashPoint(CrashEntryEnded)
	op.watch.Done()
	return nil
}

// sibling is a checked sibling request.
type sibling struct {
	bundle string
	spec   *specs.Spec
}

// checkSibling refuses a sibling that cannot be made, before anything is
// made for it (and, for a fork, before the source is frozen).
func (e *Engine) checkSibling(req MaterializeRequest) (*sibling, error) {
	if req.ID == "" {
		return nil, errors.New("no ID given for the new container")
	}
	// A foreground restore would tie the sibling's whole life to this call
	// (and to the restore timeout); conmon always detaches.
	if !req.Detach {
		return nil, errors.New("a sibling is restored from a fork plan in the background: pass --detach, then use tclone state, kill and delete on it")
	}
	if req.Bundle == "" {
		req.Bundle = "."
	}
	bundle, err := filepath.Abs(req.Bundle)
	if err != nil {
		return nil, err
	}
	spec, err := loadSpec(bundle)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the sibling's bundle %s has no config.json: give --bundle the directory of the new container's bundle", bundle)
	}
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(e.Crun.Global.StateRoot(), req.ID)); err == nil {
		return nil, fmt.Errorf("a container named %s already exists; choose another ID or delete it first", req.ID)
	}
	// Undoing a failed sibling empties its root: only a root that is ours
	// to fill is accepted.
	if err := rootfs.Fillable(rootPath(bundle, spec)); err != nil {
		return nil, err
	}
	return &sibling{bundle: bundle, spec: spec}, nil
}

// materializeOp is one sibling being made: its request, the plan it is
// made from, and where it goes.
type materializeOp struct {
	e   *Engine
	req MaterializeRequest
	p   *plan.Plan
	dir string // the plan's
	sib *sibling
	// root is the sibling's root filesystem; siblingDir holds its private
	// images and CRIU's work files.
	root, siblingDir string
	// tcp and memory are decided for this sibling.
	tcp    forkopts.TCPPolicy
	memory forkopts.Memory
	// planned is the plan's memory as this restore finds it: a twin
	// plan whose twins were drained holds page images like any other.
	planned forkopts.Memory
	// merge marks the sibling's processes mergeable (--memory ksm).
	merge bool
	// shareStats is where a copy-on-write restore's share hook writes
	// what it did.
	shareStats string
	// volumes are the plan's volume copies and the sibling's directories
	// that receive them.
	volumes []siblingVolume
	check   *criucheck.Result
	lease   *plan.Lease
	entry   *journal.Entry
	// watch is the watchdog that undoes the sibling if this tclone dies
	// before it is reported; crun's restore is reported to it.
	watch *restoreWatch
	log   *opLog
}

// run fills the sibling's root and has crun restore the tree into it.
func (op *materializeOp) run(ctx context.Context) (*Materialized, error) {
	req, p, entry, spec, bundle, root, siblingDir := op.req, op.p, op.entry, op.sib.spec, op.sib.bundle, op.root, op.siblingDir
	m := &Materialized{ID: req.ID, PlanID: p.ID, Memory: op.memory, Merge: op.merge}
	m.Hostname = siblingHostname(p, spec, req.ID)
	images := filepath.Join(siblingDir, "images")
	if !p.FilesOnly {
		if err := criuhooks.SiblingImages(plan.ImagesDir(op.dir), images, m.Hostname); err != nil {
			return nil, err
		}
	}

	if err := entry.Update(func(r *journal.Record) { r.Phase = journal.MaterializeRootfs; r.Materialize.RootFilled = true }); err != nil {
		return nil, err
	}
	t := time.Now()
	fill, err := p.Rootfs.Apply(root)
	if err != nil {
		return nil, fmt.Errorf("filling the sibling's root %s: %w", root, err)
	}
	m.Rootfs = fill
	if m.Volumes, err = fillVolumes(entry, op.volumes); err != nil {
		return nil, err
	}
	if p.Identity != forkopts.IdentityPreserve {
		if _, err := freshMachineID(root); err != nil && p.Identity == forkopts.IdentityUnique {
			return nil, fmt.Errorf("giving the sibling its own machine-id: %w", err)
		}
	}
	if m.Hostname != "" {
		if err := rewriteNameFiles(spec, bundle, req.ID, p.Source.Hostname, m.Hostname); err != nil && p.Identity == forkopts.IdentityUnique {
			return nil, err
		}
	}
	m.Timings.RootfsMs = ms(time.Since(t))
	op.log.phase("rootfs", logrus.Fields{"hostname": m.Hostname})
	crashPoint(CrashRootfsFilled)

	work := req.WorkPath
	if work == "" {
		work = filepath.Join(siblingDir, "work")
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	if err := entry.Update(func(r *journal.Record) { r.Phase = journal.MaterializeRestore; r.Materialize.SiblingCreated = true }); err != nil {
		return nil, err
	}
	t = time.Now()
	if p.FilesOnly {
		if err := op.crunStart(ctx); err != nil {
			return nil, err
		}
		m.Timings.RestoreMs = ms(time.Since(t))
		op.log.phase("start", nil)
		return m, nil
	}
	if err := op.crunRestore(ctx, images, work); err != nil {
		return nil, err
	}
	m.Timings.RestoreMs = ms(time.Since(t))
	if op.merge {
		op.e.mergingSibling(req.ID)
	}
	op.log.phase("restore", nil)
	crashPoint(CrashSiblingRestored)
	if st, err := criuhooks.RestoreStats(work); err == nil {
		m.Timings.CriuRestoreMs = float64(st.GetRestoreTime()) / 1000
		m.PagesRestored = st.GetPagesRestored()
	}
	if op.shareStats != "" {
		if err := op.readShare(ctx, m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// crunRestore has crun restore the tree into the sibling's bundle.
func (op *materializeOp) crunRestore(ctx context.Context, images, work string) error {
	e, req, p := op.e, op.req, op.p
	// The restore must declare what the dump allowed.
	declared, tcpClose := p.Capture.Restore(op.tcp)
	args := crun.Restore{
		ID: req.ID, ImagePath: images, WorkPath: work, Bundle: req.Bundle,
		Detach: req.Detach, PidFile: req.PidFile, ConsoleSocket: req.ConsoleSocket,
		Capture:           crunCapture(declared),
		ManageCgroupsMode: req.ManageCgroupsMode, LSMProfile: req.LSMProfile, LSMMountContext: req.LSMMountContext,
	}.Args()

	env := append(os.Environ(), op.check.Env()...)
	var criuConf []string
	if tcpClose {
		criuConf = append(criuConf, crun.CRIUTCPClose)
	}
	if op.memory == forkopts.MemoryLazy || op.memory == forkopts.MemoryCow {
		// (A twin plan's siblings are lazy ones.)
		// CRIU connects to the plan's daemon at the socket in its work
		// directory before it restores anything.
		client, err := op.lazyDaemon(ctx, work)
		if err != nil {
			return err
		}
		defer client.Close()
		criuConf = append(criuConf, crun.CRIULazyPages)
	}
	if op.memory == forkopts.MemoryCow {
		// At pre-resume, while CRIU holds the tasks stopped, the hook has
		// the daemon map the snapshots' pages into them.
		script, hookEnv, stats, err := lazy.ShareHook(op.siblingDir, e.lazyPaths(p.ID))
		if err != nil {
			return err
		}
		criuConf = append(criuConf, crun.CRIUActionScript+" "+script)
		env = append(env, hookEnv)
		op.shareStats = stats
	}
	if len(criuConf) > 0 {
		conf, err := crun.CRIUConfig(op.siblingDir, criuConf...)
		if err != nil {
			return err
		}
		env = append(env, conf)
	}
	if op.merge {
		// crun, CRIU and the tasks CRIU forks inherit the mark.
		if err := ksm.MarkSelf(); err != nil {
			return err
		}
	}
	if err := crun.PrepareRestore(op.sib.bundle); err != nil {
		return fmt.Errorf("restoring sibling %s: %w", req.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.criuTimeout())
	defer cancel()
	cmd := e.Crun.Command(ctx, "restore", args...)
	op.log.WithFields(logrus.Fields{"argv": cmd.Args, "criu_config": criuConf}).Debug("crun restore")
	cmd.Env = env
	err := op.runWatched(cmd)
	if err == nil {
		return nil
	}
	msg := err.Error()
	if ctx.Err() != nil {
		msg = fmt.Sprintf("timed out after %s", e.criuTimeout())
	}
	logPath := filepath.Join(work, restoreLogName)
	reasons := criuhooks.LogErrors(logPath)
	// The work directory goes with the failed sibling; its log stays.
	kept := e.keepLog(logPath, "restore", req.ID)
	cerr := &criuhooks.Error{Op: "restore", Err: fmt.Errorf("crun restore: %s", msg), Reasons: reasons, LogPath: kept}
	return fmt.Errorf("restoring sibling %s: %w", req.ID, cerr)
}

// crunCapture is what a restore declares, as crun's flags.
func crunCapture(d forkopts.Dumped) crun.Capture {
	return crun.Capture{TCPEstablished: d.TCPEstablished, FileLocks: d.FileLocks, ExtUnixSk: d.ExtUnixSk, ShellJob: d.ShellJob}
}

// runWatched runs a crun command that makes the sibling, with the caller's
// stdio, under the watchdog.
func (op *materializeOp) runWatched(cmd *exec.Cmd) error {
	// crun's stdio must be the caller's own descriptors, not pipes of ours:
	// the sibling's tree inherits them as its stdio (conmon's log pipes, or
	// the terminal), and would hold a pipe of ours open forever.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = op.req.Stdin, op.req.Stdout, op.req.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	op.watch.Watch(cmd.Process.Pid)
	// On record too, for a recovery after the watchdog died as well: a
	// crun left running (or stopped) keeps CRIU, and the caller's stdio,
	// busy.
	if crunProc, ok := journal.OwnerOf(cmd.Process.Pid); ok {
		if uerr := op.entry.Update(func(r *journal.Record) { r.Materialize.Restorer = &crunProc }); uerr != nil {
			logrus.Warnf("recording crun's %s of %s: %v", cmd.Args[1], op.req.ID, uerr)
		}
	}
	return cmd.Wait()
}

// crunStart has crun create and start the sibling of a files-only plan:
// its root filesystem and volumes are the source's, its processes start
// from its command, as a new container's.
func (op *materializeOp) crunStart(ctx context.Context) error {
	e, req := op.e, op.req
	args := crun.Args{"--bundle", req.Bundle}
	args.Value("--pid-file", req.PidFile)
	args.Value("--console-socket", req.ConsoleSocket)
	args = append(args, req.ID)
	ctx, cancel := context.WithTimeout(ctx, e.criuTimeout())
	defer cancel()
	create := e.Crun.Command(ctx, "create", args...)
	op.log.WithField("argv", create.Args).Debug("crun create")
	if err := op.runWatched(create); err != nil {
		return fmt.Errorf("creating sibling %s: crun create: %w", req.ID, err)
	}
	start := e.Crun.Command(ctx, "start", req.ID)
	if out, err := start.CombinedOutput(); err != nil {
		return fmt.Errorf("starting sibling %s: crun start: %w: %s", req.ID, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// undoMaterialize removes what a failed or abandoned Phase B made, as far as
// its journal record says it got.
func (e *Engine) undoMaterialize(ctx context.Context, r journal.Record) error {
	rec := r.MaterializeRec()
	// A crun restore that still runs (or was left stopped) would go on
	// making the sibling, or hold CRIU and the caller's stdio for ever.
	if rec.Restorer != nil {
		killTree(*rec.Restorer)
	}
	var errs []error
	if rec.SiblingCreated && rec.SiblingID != "" {
		errs = append(errs, e.removeSibling(ctx, r.CrunRoot, rec.SiblingID))
		// A restore cut short can leave restored tasks crun never
		// recorded. Only a cgroup made for this sibling (its path names
		// it) is emptied: a config could name anyone's cgroup.
		if strings.Contains(filepath.Base(rec.SiblingCgroup), rec.SiblingID) {
			errs = append(errs, cgroups.KillAll(rec.SiblingCgroup))
		}
		errs = append(errs, cgroups.RemoveLeftovers(rec.SiblingCgroup))
	}
	if rec.RootFilled && rec.RootTarget != "" {
		errs = append(errs, rootfs.Clear(rec.RootTarget))
	}
	for _, dir := range rec.VolumesFilled {
		errs = append(errs, rootfs.EmptyDir(dir))
	}
	if rec.ImagesOverlay != "" {
		// The restore's CRIU, and the tasks it forked, hold the sibling's
		// images open. When crun died first they were handed to its
		// nearest subreaper (conmon), out of reach of killTree, where a
		// task CRIU had seized stays stopped for ever.
		for _, pid := range HoldersOf(rec.ImagesOverlay) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, os.RemoveAll(rec.ImagesOverlay))
	}
	return errors.Join(errs...)
}

// lazyDaemon has the plan's lazy-pages daemon, started if none runs, wait
// for this restore's CRIU at the work directory's socket. The daemon stays
// while the returned client is open, and while the sibling fills. A
// copy-on-write plan's daemon holds the plan's memory: it is never started
// here, and without it the sibling cannot be made.
func (op *materializeOp) lazyDaemon(ctx context.Context, work string) (*lazy.Client, error) {
	cow := op.planned.Held()
	// What to do is the same whatever went wrong with the daemon.
	advise := func(err error) error {
		if cow {
			return fmt.Errorf("%w; sibling %s was not made: fork again", err, op.req.ID)
		}
		return fmt.Errorf("%w; sibling %s was not made: fork again, or with --memory copy to have its memory copied before it runs", err, op.req.ID)
	}
	paths := op.e.lazyPaths(op.p.ID)
	var client *lazy.Client
	var err error
	if cow {
		client, err = lazy.Connect(paths)
	} else {
		client, err = lazy.Ensure(ctx, paths, plan.ImagesDir(op.dir))
	}
	if err != nil {
		return nil, advise(err)
	}
	listen := client.Listen
	if cow && op.memory != forkopts.MemoryCow {
		listen = client.ListenCopying
	}
	if err := listen(filepath.Join(work, lazypages.SocketName)); err != nil {
		client.Close()
		return nil, advise(err)
	}
	op.log.phase("lazy-pages", nil)
	return client, nil
}

// readShare reports what the share hook did. A share that failed leaves
// the sibling running on copies of the pages, except when an area was
// left without its memory: the daemon then killed the sibling, and the
// sibling is not made.
func (op *materializeOp) readShare(ctx context.Context, m *Materialized) error {
	r, err := lazy.ReadShareResult(op.shareStats)
	if err != nil {
		return err
	}
	if r == nil {
		r = &lazy.ShareResult{Error: "the share hook did not run"}
	}
	m.Share = r
	if r.Error != "" {
		if st, err := op.e.Crun.State(ctx, op.req.ID); err != nil || st.Status != "running" {
			return fmt.Errorf("sibling %s lost its memory while it was shared (%s), and was killed; fork again", op.req.ID, r.Error)
		}
		logrus.Warnf("sibling %s: copy-on-write share failed (%s): it gets copies of the source's pages", op.req.ID, r.Error)
	} else if r.Refused > 0 {
		logrus.Infof("sibling %s: %d areas shared, %d copied instead (%s)", op.req.ID, r.Areas, r.Refused, r.Reason)
	}
	op.log.phase("share", logrus.Fields{"share": r})
	return nil
}
