package hostagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

// ForkHere forks in this process, through the connection to the Podman
// service of this host, which must restore with tclone. It is what tclone's
// API service runs; it needs root on the host, since it leaves the fork's
// request to tclone in the host's plan store.
//
// The call is recorded in the host's plan store while it runs (see package
// runtime/calls): if this process dies, the next fork or `tclone gc` rolls
// back what it made. Calls of clients that died are rolled back first.
func (a *Agent) ForkHere(ctx context.Context, source string, opts podmanfork.Options) (*podmanfork.Stats, error) {
	start := time.Now()
	if err := normalize(&opts); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	store := a.plans()
	src, uses, err := prepareSource(ctx, store, source, &opts)
	if err != nil {
		return nil, err
	}
	limits, err := checkIdentity(opts.Identity, src)
	if err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	names, err := newNamer(ctx, src.Name, opts)
	if err != nil {
		return nil, err
	}
	f := &forker{opts: opts, src: src, store: store, start: start, names: names,
		identityLimits: limits, srcID: readSourceIdentity(src), volumes: uses}
	defer f.cleanupFiles()
	stats, err := f.run(ctx)
	if err != nil {
		return nil, f.failed(ctx, "fork of "+src.Name, err)
	}
	stats.TotalMs = ms(time.Since(start))
	return stats, nil
}

// failed ends a call that failed (what names it): everything it made is
// rolled back, and a cancelled call says it was.
func (f *forker) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		err = fmt.Errorf("%s cancelled (%v); everything it made was removed", what, context.Cause(ctx))
	}
	return errors.Join(err, f.rollback(ctx))
}

// prepareSource is the start of every capture of source: it rolls back the
// calls of dead clients, inspects the source, and works out what each
// sibling gets of its volumes. tclone copies them in the source's frozen
// window; opts.Fork.Volumes, in the fork intent, tells it which.
func prepareSource(ctx context.Context, store plan.Store, source string, opts *podmanfork.Options) (*define.InspectContainerData, []podmanfork.VolumeUse, error) {
	collectDeadCalls(ctx, store)
	src, err := inspectSource(ctx, source)
	if err != nil {
		return nil, nil, err
	}
	if err := checkOwnPIDNamespace(src, opts.Fork.FilesOnly); err != nil {
		return nil, nil, podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	copies, uses, err := planVolumes(src, opts.VolumeModes)
	if err != nil {
		return nil, nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	opts.Fork.Volumes = copies
	return src, uses, nil
}

// checkOwnPIDNamespace refuses a source that shares a PID namespace (Podman's
// --pid=host, --pid=container:NAME, --pid=ns:PATH): a sibling Podman makes
// of it shares the same one, where its processes' PIDs are the source's
// own, still in use, so CRIU could never rebuild them there. It says so
// before the source is held. A files-only fork rebuilds no process, and is
// let through.
func checkOwnPIDNamespace(src *define.InspectContainerData, filesOnly bool) error {
	if src.HostConfig == nil || filesOnly {
		return nil
	}
	switch mode := src.HostConfig.PidMode; {
	case mode == "" || mode == "private":
		return nil
	default:
		return fmt.Errorf("cannot fork %s: it shares a PID namespace (--pid=%s), and so would its siblings, where its processes' PIDs are still the source's; fork a container run with its own PID namespace, or fork its files only (--files-only)", src.Name, mode)
	}
}

// collectDeadCalls rolls back the calls of fork clients that died. It is
// housekeeping: a failure is logged, and the fork goes on.
func collectDeadCalls(ctx context.Context, store plan.Store) {
	col := calls.Collector{Dir: calls.DirOf(store), Store: store, Podman: bindingsPodman{}}
	rep, err := col.Collect(ctx)
	if err != nil {
		logrus.Warnf("rolling back forks whose client died: %v (run tclone gc)", err)
	}
	for _, c := range rep.Calls {
		logrus.Infof("rolled back fork call %s of dead client %d: removed %d containers", c.Nonce, c.Owner.Pid, len(c.Siblings))
	}
}

// forker carries one fork call and what it has made so far.
type forker struct {
	// importedVolumes are an imported branch's volume mount points and
	// their directories here (nil for every other start).
	importedVolumes map[string]string
	opts            podmanfork.Options
	src             *define.InspectContainerData
	store           plan.Store
	start           time.Time
	names           *namer
	// srcID and identityLimits are what the siblings' identities are
	// checked against.
	srcID          sourceIdentity
	identityLimits map[string]string
	crun           *crun.Runtime
	// crunRoot is where crun keeps the siblings' state: where it kept
	// the source's.
	crunRoot string
	// volumes is what every sibling gets of the source's mounts.
	volumes []podmanfork.VolumeUse

	call    *calls.Call
	nonce   string
	tmpDir  string
	planDir string

	// mu guards what concurrent restores share: the names, the siblings
	// made and the call's record.
	// branch is the branch the siblings start from, if they do;
	// runnable says a branch being created was reported runnable.
	branch   *branch.Branch
	runnable bool

	mu       sync.Mutex
	made     []string // sibling IDs, for rollback
	inflight int      // restores under way
	pids     map[*podmanfork.Result]int
}

// setPid records the pid of a sibling's first process, as Podman reports it.
func (f *forker) setPid(r *podmanfork.Result, pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pids == nil {
		f.pids = map[*podmanfork.Result]int{}
	}
	f.pids[r] = pid
}

// pid is the pid setPid recorded for r.
func (f *forker) pid(r *podmanfork.Result) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pids[r]
}

// restoreAll makes every sibling, up to opts.Parallel at a time. The first
// failure stops the others; the caller rolls back what any of them made.
func (f *forker) restoreAll(ctx context.Context, archive string) ([]*podmanfork.Result, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	results := make([]*podmanfork.Result, f.opts.Count)
	slots := make(chan struct{}, f.opts.Parallel)
	var wg sync.WaitGroup
	for i := range results {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			var err error
			if results[i], err = f.restoreNamed(ctx, archive, i); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	// The first failure (the cause of the cancellation), not what the
	// cancellation did to the restores under way.
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return results, nil
}

func (f *forker) run(ctx context.Context) (*podmanfork.Stats, error) {
	archive, err := f.begin()
	if err != nil {
		return nil, err
	}
	stats := &podmanfork.Stats{Source: f.src.ID, Call: f.nonce}
	t := time.Now()
	capture, err := f.checkpoint(ctx, archive)
	if err != nil {
		return nil, err
	}
	stats.CheckpointMs = ms(time.Since(t))
	stats.Capture = *capture
	stats.SourcePauseMs = capture.Timings.SourcePauseMs
	if err := f.makeSiblings(ctx, archive, stats); err != nil {
		return nil, err
	}
	// A source stopped or removed while the siblings were being made ends
	// the fork: siblings of a source the user just took down are not what
	// was asked for.
	if _, err := inspectSource(ctx, f.src.ID); err != nil {
		return nil, fmt.Errorf("the source changed while the fork was in progress: %w", err)
	}
	if err := f.finish(); err != nil {
		return nil, err
	}
	return stats, nil
}

// begin records the call, so that a rollback finds whatever it makes even
// after this process died, and makes its scratch directory. It returns
// where the checkpoint archive goes.
func (f *forker) begin() (archive string, err error) {
	f.call, err = calls.DirOf(f.store).Begin(calls.Record{SourceID: f.src.ID})
	if err != nil {
		return "", fmt.Errorf("this must run on the Podman host, as root: %w", err)
	}
	f.nonce = f.call.Record().Nonce
	if f.tmpDir, err = calls.MkdirTemp(f.store, "tclone-fork-"); err != nil {
		return "", err
	}
	if err := f.call.Update(func(r *calls.Record) { r.TempDirs = append(r.TempDirs, f.tmpDir) }); err != nil {
		return "", err
	}
	return filepath.Join(f.tmpDir, "checkpoint.tar"), nil
}

// makeSiblings restores every sibling from the archive into stats.
func (f *forker) makeSiblings(ctx context.Context, archive string, stats *podmanfork.Stats) error {
	var err error
	if stats.Siblings, err = f.restoreAll(ctx, archive); err != nil {
		return err
	}
	// After every restore, so that waiting for one sibling's memory does
	// not hold a restore slot another sibling could use.
	if f.opts.WaitMemory {
		return f.waitMemoryAll(ctx, stats.Siblings)
	}
	return nil
}

// finish ends a call that succeeded.
func (f *forker) finish() error {
	// Every use of the plan is taken; tclone removed it with the last one.
	// Make sure, in case a sibling was restored outside this plan's count.
	f.store.Remove(f.planDir)
	f.planDir = ""
	// The siblings are reported only once no collector can take this call
	// for a dead one and undo it; nothing but that report may come after,
	// so that a client killed in between leaves the least behind.
	f.cleanupFiles()
	if err := f.call.End(); err != nil {
		return fmt.Errorf("closing the record of this fork call: %w", err)
	}
	f.call = nil
	return nil
}

// checkpoint leaves a fork intent for tclone and has Podman checkpoint the
// source into an archive, which then refers to a fork plan.
func (f *forker) checkpoint(ctx context.Context, archive string) (*plan.Plan, error) {
	intent := plan.Intent{
		ContainerID: f.src.ID,
		Nonce:       fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()),
		Fork:        f.opts.Fork,
	}
	// Another fork of this source between our intent and our checkpoint
	// would take or replace the intent.
	unlock, err := f.store.LockIntents(f.src.ID)
	if err != nil {
		return nil, fmt.Errorf("this must run on the Podman host, as root: %w", err)
	}
	defer unlock()
	if err := f.store.WriteIntent(intent); err != nil {
		return nil, fmt.Errorf("leaving a fork intent for tclone (this must run on the Podman host, as root): %w", err)
	}
	defer f.store.RemoveIntent(f.src.ID, intent.Nonce)
	if err := f.call.Update(func(r *calls.Record) { r.IntentNonce = intent.Nonce }); err != nil {
		return nil, err
	}

	// A capture tclone made before the checkpoint failed is found by its
	// time. Only a fork holding the intent lock can capture this source,
	// so, removed before the lock is let go, it can only be this call's.
	asked := time.Now().UTC()
	captured := false
	defer func() {
		if !captured {
			f.store.RemoveCapturedSince(f.src.ID, asked)
		}
	}()
	// Podman's checkpoint goes on when its HTTP request is dropped, holding
	// the source until CRIU is done. So a cancelled fork waits for the call,
	// and tells tclone's capture to stop instead, which ends it at once.
	marked := make(chan struct{})
	notCancelled := context.AfterFunc(ctx, func() {
		defer close(marked)
		if err := f.store.CancelIntent(f.src.ID, intent.Nonce); err != nil {
			logrus.Warnf("telling the capture of %s to stop: %v", f.src.Name, err)
		}
	})
	_, err = containers.Checkpoint(context.WithoutCancel(ctx), f.src.ID, new(containers.CheckpointOptions).
		WithLeaveRunning(true).WithIgnoreRootfs(true).WithExport(archive).
		WithFileLocks(f.opts.FileLocks))
	if !notCancelled() {
		<-marked
		f.store.RemoveIntentCancel(f.src.ID, intent.Nonce)
	}
	if err == nil && ctx.Err() != nil {
		// Captured before the cancellation reached tclone: the plan is
		// removed with the call's rollback.
		err = ctx.Err()
	}
	if err != nil {
		// Podman's error says only that the runtime failed; tclone left
		// its reason for the fork it could not capture.
		if why, rerr := f.store.TakeIntentResult(f.src.ID, intent.Nonce); rerr == nil && why != "" {
			return nil, fmt.Errorf("capturing %s: %s", f.src.Name, strings.TrimPrefix(why, "capturing "+f.src.ID+": "))
		}
		return nil, fmt.Errorf("capturing %s: %w", f.src.Name, err)
	}
	ref, err := readReference(archive)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", f.src.Name, err)
	}
	f.planDir = ref.PlanDir
	captured = true
	if err := f.call.Update(func(r *calls.Record) { r.PlanDir = ref.PlanDir }); err != nil {
		return nil, err
	}
	p, err := plan.Read(ref.PlanDir)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", f.src.Name, err)
	}
	f.crunRoot = p.Source.CrunRoot
	return p, nil
}

// maxNameTries bounds how often a default name is tried again after
// another fork took it first.
const maxNameTries = 64

// restoreNamed makes sibling number i. A default name that another call
// took in the meantime is replaced by the next free one; a name the user
// gave is not.
func (f *forker) restoreNamed(ctx context.Context, archive string, i int) (*podmanfork.Result, error) {
	for try := 1; ; try++ {
		f.mu.Lock()
		name := f.names.name(i)
		f.mu.Unlock()
		r, err := f.restore(ctx, archive, name, i)
		if err == nil {
			return r, nil
		}
		if !nameInUse(err) || !f.names.defaulted() || try == maxNameTries {
			return nil, fmt.Errorf("sibling %d of %d (%s): %w", i+1, f.opts.Count, name, err)
		}
		logrus.Debugf("name %s was taken meanwhile; trying the next one", name)
		f.mu.Lock()
		err = f.names.clash(ctx, i)
		f.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// restore makes sibling number i, called name, from the archive.
func (f *forker) restore(ctx context.Context, archive, name string, i int) (*podmanfork.Result, error) {
	r := &podmanfork.Result{Name: name}
	if f.opts.Identity != forkopts.IdentityPreserve && f.identityLimits["hostname"] == "" {
		r.Hostname = hostnameFor(name)
	}
	labels := map[string]string{podmanfork.LabelForkedFrom: f.src.ID, calls.LabelCall: f.nonce}
	if f.branch != nil {
		labels[podmanfork.LabelBranch] = f.branch.ID
	}
	for k, v := range f.opts.Labels {
		labels[k] = v
	}
	vols, edit, err := siblingVolumes(ctx, f.volumes, name)
	if err != nil {
		return nil, err
	}
	r.Volumes = vols
	edit.Hostname, edit.Labels, edit.DropPorts = r.Hostname, labels, true
	own := filepath.Join(f.tmpDir, fmt.Sprintf("sibling-%d.tar", i))
	err = writeSiblingArchive(archive, own, edit)
	if err != nil {
		return nil, fmt.Errorf("preparing its configuration: %w", err)
	}
	opts := new(containers.RestoreOptions).WithImportArchive(own).WithName(name).
		WithIgnoreRootfs(true).WithIgnoreVolumes(true).WithIgnoreStaticIP(f.opts.IgnoreStaticIP).WithIgnoreStaticMAC(f.opts.IgnoreStaticMAC).
		WithFileLocks(f.opts.FileLocks)
	if len(f.opts.Publish) > 0 {
		opts = opts.WithPublishPorts(f.opts.Publish)
	}
	t := time.Now()
	r.RestoreStartMs = ms(t.Sub(f.start))
	f.mu.Lock()
	f.inflight++
	f.mu.Unlock()
	rep, err := containers.Restore(ctx, "", opts)
	f.mu.Lock()
	f.inflight--
	alone := f.inflight == 0
	f.mu.Unlock()
	if rep != nil && rep.Id != "" {
		if uerr := f.adopt(rep.Id); uerr != nil {
			return nil, uerr
		}
	}
	if err != nil {
		// Podman may have created the container before the restore itself
		// failed (a port it cannot bind, say) without telling us its ID;
		// it carries this call's label. While other restores of this call
		// are under way, a container they are making carries it too: the
		// rollback, after they end, removes strays then.
		if alone {
			f.removeStrays(ctx)
		}
		if nameInUse(err) {
			return nil, explainRestoreError(err)
		}
		// Asking the service for its configuration is slow (about a
		// second), so it is done only to explain a failure.
		if serr := checkService(ctx); serr != nil {
			return nil, fmt.Errorf("%w (%v)", serr, err)
		}
		return nil, explainRestoreError(err)
	}
	r.RestoreMs = ms(time.Since(t))
	r.ID = rep.Id

	deadline := time.Now().Add(f.opts.ReadyTimeout)
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := f.waitRunning(hctx, r); err != nil {
		return nil, err
	}
	if err := f.verifyIdentity(r); err != nil {
		return nil, err
	}
	if err := f.hooks(hctx, r); err != nil {
		return nil, err
	}
	if err := f.ready(hctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// adopt records a container this call made, for rollback, before anything
// else happens to it.
func (f *forker) adopt(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.made {
		if m == id {
			return nil
		}
	}
	f.made = append(f.made, id)
	return f.call.Update(func(r *calls.Record) { r.Siblings = append(r.Siblings, id) })
}

// removeStrays removes the containers a failed restore of this call left:
// those with this call's label that it does not know by ID. A stray that
// cannot be removed now is left to the rollback.
func (f *forker) removeStrays(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	pm := bindingsPodman{}
	labelled, err := pm.Labelled(ctx, calls.LabelCall)
	if err != nil {
		logrus.Warnf("listing what the failed restore left: %v", err)
		return
	}
	known := map[string]bool{}
	f.mu.Lock()
	for _, id := range f.made {
		known[id] = true
	}
	f.mu.Unlock()
	for id, nonce := range labelled {
		if nonce != f.nonce || known[id] {
			continue
		}
		if err := pm.Remove(ctx, id); err != nil {
			f.adopt(id)
		}
	}
}

// rollback removes every container this call made and its capture. It
// removes by ID only: what it recorded, and what carries this call's label.
func (f *forker) rollback(ctx context.Context) error {
	// The caller's context may be what failed (cancelled, timed out);
	// cleanup must still run on its connection.
	cancelled := ctx.Err() != nil
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if f.call != nil {
		f.removeStrays(ctx)
	}
	for _, id := range f.made {
		// A sibling being rolled back has nothing to shut down cleanly.
		if _, err := containers.Remove(ctx, id, new(containers.RemoveOptions).WithForce(true).WithIgnore(true).WithTimeout(0).WithVolumes(true)); err != nil {
			errs = append(errs, fmt.Errorf("removing sibling %s: %w", id, err))
		}
	}
	if f.planDir != "" {
		errs = append(errs, f.store.Remove(f.planDir))
	}
	err := errors.Join(errs...)
	switch {
	case f.call == nil:
	case err != nil:
		// The record stays: once this process is gone, the next fork or
		// tclone gc finishes the rollback.
		err = fmt.Errorf("%w; run tclone gc to finish the cleanup", err)
	case cancelled:
		// A request cut short may still be making a container in the
		// service: the record lingers so collectors sweep its label.
		f.call.Update(func(r *calls.Record) { r.RolledBack = time.Now().UTC() })
	default:
		f.call.End()
	}
	if err != nil {
		return fmt.Errorf("cleaning up the failed fork: %w", err)
	}
	return nil
}

func (f *forker) cleanupFiles() {
	if f.tmpDir != "" {
		os.RemoveAll(f.tmpDir)
		f.tmpDir = ""
	}
}

var nameInUseRE = regexp.MustCompile(`name "?[^" ]+"? is (already )?in use|container already exists`)

// nameInUse recognises Podman's answer to a name another container holds.
func nameInUse(err error) bool {
	return nameInUseRE.MatchString(err.Error())
}

// explainRestoreError adds advice to the restore failures users can fix.
func explainRestoreError(err error) error {
	msg := strings.ToLower(err.Error())
	switch {
	case nameInUse(err):
		return podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("%w: choose another --name, or leave --name out for SOURCE-fork-<n>", err))
	case strings.Contains(msg, "address already in use") || strings.Contains(msg, "port is already allocated") ||
		strings.Contains(msg, "bind: address"):
		return podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("%w: a --publish host port is taken (the source or another container holds it); choose a free host port, or give only the container port so Podman picks one", err))
	case strings.Contains(msg, "requested ip address") || strings.Contains(msg, "static ip"):
		return podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("%w: the source has a static IP; fork with --ignore-static-ip", err))
	case strings.Contains(msg, "mac address"):
		return podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("%w: the source has a static MAC address; fork with --ignore-static-mac", err))
	}
	return err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
