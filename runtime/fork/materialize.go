package fork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
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
	// watch is the watchdog that undoes the sibling if this tclone dies
	// before committing it; crun's restore is reported to it.
	watch *restoreWatch
	// tcp is the policy decided for this sibling.
	tcp forkopts.TCPPolicy
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
	} `json:"timings"`
	PagesRestored uint64 `json:"pages_restored"`

	// reported ends the operation; see Reported.
	reported func() error
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
	bundle, spec := sib.bundle, sib.spec
	if p.Source.NetNSPath != "" {
		if path, _ := namespacePath(spec, "network"); path == "" {
			return nil, fmt.Errorf("the source joined network namespace %s by path, so the sibling's config.json must name a network namespace path too (Podman does this); create one (ip netns add NAME) and set linux.namespaces[network].path", p.Source.NetNSPath)
		}
	}
	if req.tcp, err = siblingTCPPolicy(p, req, spec); err != nil {
		return nil, err
	}
	root := rootPath(bundle, spec)
	// Refuse a root that is not ours to fill before making anything:
	// undoing a failed sibling empties its root.
	if _, err := p.Rootfs.CheckTarget(root); err != nil {
		return nil, err
	}
	check, err := criucheck.Check(ctx)
	if err != nil {
		return nil, err
	}
	lease, err := e.Store.Acquire(dir)
	if err != nil {
		return nil, err
	}
	siblingDir := e.Store.SiblingDir(req.ID)
	entry, err := e.Journal.Begin(journal.Record{
		Kind: journal.Materialize, Phase: "prepare", PlanDir: dir, SiblingID: req.ID,
		RootTarget: root, CrunRoot: e.Crun.Global.Root, ImagesOverlay: siblingDir,
		SiblingCgroup: spec.Linux.CgroupsPath, OwnsPlan: req.ownsPlan,
	})
	if err != nil {
		lease.Release(false)
		return nil, err
	}
	req.watch, err = e.startRestoreWatch(entry, req.Stderr)
	if err != nil {
		lease.Release(false)
		entry.End()
		return nil, err
	}
	m, err := e.materialize(ctx, req, p, dir, spec, bundle, root, siblingDir, check, entry)
	if err != nil {
		err = errors.Join(err, e.undoMaterialize(ctx, entry.Rec))
		lease.Release(false)
		entry.End()
		req.watch.Done()
		return nil, err
	}
	os.RemoveAll(siblingDir)
	m.Timings.TotalMs = ms(time.Since(start))
	// The use, the entry and the watchdog are let go when the sibling is
	// reported, not before.
	m.reported = func() error {
		crashPoint(CrashBeforeReport)
		if err := lease.Release(true); err != nil {
			return fmt.Errorf("sibling %s was restored, but recording the plan's use failed: %w; it is removed again", req.ID, err)
		}
		if err := entry.End(); err != nil {
			return fmt.Errorf("sibling %s was restored, but ending its journal entry failed: %w; it is removed again", req.ID, err)
		}
		req.watch.Done()
		return nil
	}
	return m, nil
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

func (e *Engine) materialize(ctx context.Context, req MaterializeRequest, p *plan.Plan, dir string, spec *specs.Spec, bundle, root, siblingDir string, check *criucheck.Result, entry *journal.Entry) (*Materialized, error) {
	m := &Materialized{ID: req.ID, PlanID: p.ID}
	m.Hostname = siblingHostname(p, spec, req.ID)
	images := filepath.Join(siblingDir, "images")
	if err := siblingImages(plan.ImagesDir(dir), images, m.Hostname); err != nil {
		return nil, err
	}

	if err := entry.Update(func(r *journal.Record) { r.Phase = "rootfs"; r.RootFilled = true }); err != nil {
		return nil, err
	}
	t := time.Now()
	fill, err := p.Rootfs.Apply(root)
	if err != nil {
		return nil, fmt.Errorf("filling the sibling's root %s: %w", root, err)
	}
	m.Rootfs = fill
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
	crashPoint(CrashRootfsFilled)

	work := req.WorkPath
	if work == "" {
		work = filepath.Join(siblingDir, "work")
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	if err := entry.Update(func(r *journal.Record) { r.Phase = "restore"; r.SiblingCreated = true }); err != nil {
		return nil, err
	}
	t = time.Now()
	if err := e.crunRestore(ctx, req, p, images, work, siblingDir, check); err != nil {
		return nil, err
	}
	m.Timings.RestoreMs = ms(time.Since(t))
	crashPoint(CrashSiblingRestored)
	if st, err := criuhooks.RestoreStats(work); err == nil {
		m.Timings.CriuRestoreMs = float64(st.GetRestoreTime()) / 1000
		m.PagesRestored = st.GetPagesRestored()
	}
	return m, nil
}

// crunRestore has crun restore the tree into the sibling's bundle.
func (e *Engine) crunRestore(ctx context.Context, req MaterializeRequest, p *plan.Plan, images, work, siblingDir string, check *criucheck.Result) error {
	// The restore must declare what the dump allowed.
	declared, tcpClose := p.Capture.Restore(req.tcp)
	args := crun.Args{"--image-path", images, "--work-path", work, "--bundle", req.Bundle}
	args.Flag("--detach", req.Detach)
	args.Value("--pid-file", req.PidFile)
	args.Value("--console-socket", req.ConsoleSocket)
	args = append(args, declared...)
	args.Value("--manage-cgroups-mode", req.ManageCgroupsMode)
	args.Value("--lsm-profile", req.LSMProfile)
	args.Value("--lsm-mount-context", req.LSMMountContext)
	args = append(args, req.ID)

	env := append(os.Environ(), check.Env()...)
	if tcpClose {
		conf, err := forkopts.CRIUConfig(siblingDir)
		if err != nil {
			return err
		}
		env = append(env, conf)
	}
	ctx, cancel := context.WithTimeout(ctx, e.criuTimeout())
	defer cancel()
	cmd := e.Crun.Command(ctx, "restore", args...)
	cmd.Env = env
	// crun's stdio must be the caller's own descriptors, not pipes of ours:
	// the restored tree inherits them as its stdio (conmon's log pipes, or
	// the terminal), and would hold a pipe of ours open forever.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	err := cmd.Start()
	if err == nil {
		req.watch.Watch(cmd.Process.Pid)
		err = cmd.Wait()
	}
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
	kept := keepLog(logPath, "restore", req.ID)
	cerr := &criuhooks.Error{Op: "restore", Err: fmt.Errorf("crun restore: %s", msg), Reasons: reasons, LogPath: kept}
	return fmt.Errorf("restoring sibling %s: %w", req.ID, cerr)
}

// undoMaterialize removes what a failed or abandoned Phase B made, as far as
// its journal record says it got.
func (e *Engine) undoMaterialize(ctx context.Context, rec journal.Record) error {
	var errs []error
	if rec.SiblingCreated && rec.SiblingID != "" {
		errs = append(errs, e.removeSibling(ctx, rec.CrunRoot, rec.SiblingID))
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
	if rec.ImagesOverlay != "" {
		errs = append(errs, os.RemoveAll(rec.ImagesOverlay))
	}
	return errors.Join(errs...)
}
