package podmanfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/tempdir"
)

// Result describes one sibling.
type Result struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Hostname string `json:"hostname"`
	IP       string `json:"ip,omitempty"`
	// RestoreMs is Podman's restore call for this sibling.
	RestoreMs float64 `json:"restore_ms"`
	HookMs    float64 `json:"hook_ms"`
	ReadyMs   float64 `json:"ready_ms"`
	// FirstCommandMs runs from the start of the fork request to the first
	// command that succeeded in this sibling: the latency a user feels.
	FirstCommandMs float64 `json:"first_command_ms"`
}

// Stats describes the whole call.
type Stats struct {
	Source       string  `json:"source"`
	CheckpointMs float64 `json:"checkpoint_ms"`
	// SourcePauseMs is how long the source could not run.
	SourcePauseMs float64   `json:"source_pause_ms"`
	Capture       plan.Plan `json:"capture"`
	TotalMs       float64   `json:"total_ms"`
	Siblings      []*Result `json:"siblings"`
}

// Fork forks the running container source into opts.Count siblings through
// the Podman connection in ctx (bindings.NewConnection). All or nothing: on
// any failure every sibling of this call is removed, the capture is
// discarded, and the source runs on untouched.
func Fork(ctx context.Context, source string, opts Options) ([]Result, error) {
	st, err := ForkWithStats(ctx, source, opts)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(st.Siblings))
	for i, r := range st.Siblings {
		out[i] = *r
	}
	return out, nil
}

// ForkWithStats is Fork, also returning timings of every phase.
func ForkWithStats(ctx context.Context, source string, opts Options) (*Stats, error) {
	start := time.Now()
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	src, err := inspectSource(ctx, source)
	if err != nil {
		return nil, err
	}
	names, err := siblingNames(ctx, src.Name, opts)
	if err != nil {
		return nil, err
	}
	f := &forker{opts: opts, src: src, store: plan.DefaultStore(), start: start}
	defer f.cleanupFiles()
	stats, err := f.run(ctx, names)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("fork of %s cancelled (%v); everything it made was removed", src.Name, context.Cause(ctx))
		}
		return nil, errors.Join(err, f.rollback(ctx))
	}
	stats.TotalMs = ms(time.Since(start))
	return stats, nil
}

// forker carries one fork call and what it has made so far.
type forker struct {
	opts  Options
	src   *define.InspectContainerData
	store plan.Store
	start time.Time

	tmpDir  string
	planDir string
	// captureAsked is when the checkpoint was requested: a capture tclone
	// made before the checkpoint failed is found by it.
	captureAsked time.Time
	made         []string // sibling IDs, for rollback
}

func (f *forker) run(ctx context.Context, names []string) (*Stats, error) {
	var err error
	// Owned by this process, so `tclone gc` removes it if we are killed.
	f.tmpDir, err = tempdir.Make(tempdir.ForkPrefix)
	if err != nil {
		return nil, err
	}
	archive := filepath.Join(f.tmpDir, "checkpoint.tar")
	stats := &Stats{Source: f.src.ID}

	t := time.Now()
	capture, err := f.checkpoint(ctx, archive)
	if err != nil {
		return nil, err
	}
	stats.CheckpointMs = ms(time.Since(t))
	stats.Capture = *capture
	stats.SourcePauseMs = capture.Timings.SourcePauseMs

	for i, name := range names {
		r, err := f.restore(ctx, archive, name, i)
		if err != nil {
			return nil, fmt.Errorf("sibling %d of %d (%s): %w", i+1, len(names), name, err)
		}
		stats.Siblings = append(stats.Siblings, r)
	}
	// A source stopped or removed while the siblings were being made ends
	// the fork: siblings of a source the user just took down are not what
	// was asked for.
	if _, err := inspectSource(ctx, f.src.ID); err != nil {
		return nil, fmt.Errorf("the source changed while the fork was in progress: %w", err)
	}
	// Every use of the plan is taken; tclone removed it with the last one.
	// Make sure, in case a sibling was restored outside this plan's count.
	f.store.Remove(f.planDir)
	f.planDir = ""
	return stats, nil
}

// checkpoint leaves a fork intent for tclone and has Podman checkpoint the
// source into an archive, which then refers to a fork plan.
func (f *forker) checkpoint(ctx context.Context, archive string) (*plan.Plan, error) {
	intent := plan.Intent{
		ContainerID: f.src.ID,
		Nonce:       fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()),
		Uses:        f.opts.Count,
		TTL:         f.planTTL(),
		Identity:    f.opts.Identity,
		Options:     plan.CaptureOptions{FileLocks: f.opts.FileLocks},
		// A sibling has its own address: it never keeps the connections.
		TCP: plan.TCPClose,
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

	f.captureAsked = time.Now().UTC()
	_, err = containers.Checkpoint(ctx, f.src.ID, new(containers.CheckpointOptions).
		WithLeaveRunning(true).WithIgnoreRootfs(true).WithExport(archive).
		WithFileLocks(f.opts.FileLocks))
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
	p, err := plan.Read(ref.PlanDir)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", f.src.Name, err)
	}
	return p, nil
}

// planTTL keeps the capture at least as long as this call may take to make
// every sibling (each may spend ReadyTimeout on hooks and readiness).
func (f *forker) planTTL() time.Duration {
	if f.opts.PlanTTL > 0 {
		return f.opts.PlanTTL
	}
	return 10*time.Minute + time.Duration(f.opts.Count)*(f.opts.ReadyTimeout+time.Minute)
}

// restore makes sibling number i from the archive.
func (f *forker) restore(ctx context.Context, archive, name string, i int) (*Result, error) {
	r := &Result{Name: name}
	if f.opts.Identity != plan.IdentityPreserve {
		r.Hostname = hostnameFor(name)
	}
	labels := map[string]string{LabelForkedFrom: f.src.ID}
	for k, v := range f.opts.Labels {
		labels[k] = v
	}
	own := filepath.Join(f.tmpDir, fmt.Sprintf("sibling-%d.tar", i))
	err := writeSiblingArchive(archive, own, siblingEdit{Hostname: r.Hostname, Labels: labels, DropPorts: true})
	if err != nil {
		return nil, fmt.Errorf("preparing its configuration: %w", err)
	}
	opts := new(containers.RestoreOptions).WithImportArchive(own).WithName(name).
		WithIgnoreRootfs(true).WithIgnoreStaticIP(f.opts.IgnoreStaticIP).WithIgnoreStaticMAC(f.opts.IgnoreStaticMAC).
		WithFileLocks(f.opts.FileLocks)
	if len(f.opts.Publish) > 0 {
		opts = opts.WithPublishPorts(f.opts.Publish)
	}
	t := time.Now()
	rep, err := containers.Restore(ctx, "", opts)
	if rep != nil && rep.Id != "" {
		f.made = append(f.made, rep.Id)
	}
	if err != nil {
		// Podman may have created the container before the restore itself
		// failed (a port it cannot bind, say) without telling us its ID.
		f.adoptFailed(ctx, name)
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
	if err := f.identify(hctx, r); err != nil {
		return nil, err
	}
	if err := f.ready(hctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// adoptFailed records, for rollback, a container that a failed restore left
// under the sibling's name, if it is one of this source's siblings.
func (f *forker) adoptFailed(ctx context.Context, name string) {
	data, err := containers.Inspect(context.WithoutCancel(ctx), name, nil)
	if err != nil || data.Config == nil || data.Config.Labels[LabelForkedFrom] != f.src.ID {
		return
	}
	for _, id := range f.made {
		if id == data.ID {
			return
		}
	}
	f.made = append(f.made, data.ID)
}

// rollback removes every sibling this call made and its capture.
func (f *forker) rollback(ctx context.Context) error {
	// The caller's context may be what failed (cancelled, timed out);
	// cleanup must still run on its connection.
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, id := range f.made {
		// A sibling being rolled back has nothing to shut down cleanly.
		if _, err := containers.Remove(ctx, id, new(containers.RemoveOptions).WithForce(true).WithIgnore(true).WithTimeout(0)); err != nil {
			errs = append(errs, fmt.Errorf("removing sibling %s: %w", id, err))
		}
	}
	switch {
	case f.planDir != "":
		errs = append(errs, f.store.Remove(f.planDir))
	case !f.captureAsked.IsZero():
		errs = append(errs, f.store.RemoveCapturedSince(f.src.ID, f.captureAsked))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up the failed fork: %w", err)
	}
	return nil
}

func (f *forker) cleanupFiles() {
	if f.tmpDir != "" {
		os.RemoveAll(f.tmpDir)
	}
}

// explainRestoreError adds advice to the restore failures users can fix.
func explainRestoreError(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "address already in use") || strings.Contains(msg, "port is already allocated") ||
		strings.Contains(msg, "bind: address"):
		return fmt.Errorf("%w: a --publish host port is taken (the source or another container holds it); choose a free host port, or give only the container port so Podman picks one", err)
	case strings.Contains(msg, "requested IP address") || strings.Contains(msg, "static IP"):
		return fmt.Errorf("%w: the source has a static IP; fork with --ignore-static-ip", err)
	case strings.Contains(msg, "MAC"):
		return fmt.Errorf("%w: the source has a static MAC address; fork with --ignore-static-mac", err)
	}
	return err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
