package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
	"github.com/tclone/tclone/runtime/wptrack"
	"github.com/tclone/tclone/shim/podmanfork"
)

// branchEngine is what this package keeps in a branch (branch.Branch's
// Engine) to start siblings from it once its source is gone.
type branchEngine struct {
	// Source is Podman's inspection of the source at the capture.
	Source  *define.InspectContainerData `json:"source"`
	Volumes []podmanfork.VolumeUse       `json:"volumes,omitempty"`
	// The source's identity, which siblings must not share.
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machine_id,omitempty"`
}

// CreateBranch captures the running container source, as a fork would, and
// keeps the capture on disk as branch name. The source is paused only for
// the capture; the branch is written after it runs on. A failure, or this
// process's death, leaves no branch (`tclone gc` removes what a dead one
// wrote).
//
// runnable, when not nil, is told once the source is captured and runs on,
// while the branch is written. An error from it (its caller is gone) ends
// the creation, which is rolled back. A failure after it returned leaves
// the branch listed as failed, with why.
func (a *Agent) CreateBranch(ctx context.Context, source, name string, opts podmanfork.BranchOptions, runnable func(*branch.Branch) error) (*podmanfork.BranchStats, error) {
	start := time.Now()
	if err := branch.CheckName(name); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	// The branch's labels are its own, not its siblings'.
	fo := podmanfork.Options{VolumeModes: opts.VolumeModes}
	fo.FileLocks = opts.FileLocks
	// A branch keeps page images: never module snapshots, whose memory
	// lives only as long as the plan, but twins, which the plan's daemon
	// drains into images, where the host can (the pause is then the
	// fork's); its starts choose their own memory mode.
	fo.Durable = true
	fo.BranchStore = a.Branches().Dir
	if err := normalize(&fo); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	store := a.plans()
	src, uses, err := prepareSource(ctx, store, source, &fo)
	if err != nil {
		return nil, err
	}
	bstore := a.Branches()
	w, err := bstore.Begin(name, branch.Source{ID: src.ID, Name: src.Name, Image: src.ImageName, ImageID: src.Image})
	if errors.Is(err, branch.ErrNameTaken) {
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	if err != nil {
		return nil, err
	}
	f := &forker{opts: fo, src: src, store: store, start: start, volumes: uses}
	defer f.cleanupFiles()
	stats, err := f.writeBranch(ctx, w, opts, runnable)
	if err != nil {
		if f.runnable {
			w.Fail(err)
		} else {
			w.Abort()
		}
		return nil, f.failed(ctx, fmt.Sprintf("branch %s of %s", name, src.Name), err)
	}
	stats.DurableMs = ms(time.Since(start))
	return stats, nil
}

func (f *forker) writeBranch(ctx context.Context, w *branch.Writer, opts podmanfork.BranchOptions, runnable func(*branch.Branch) error) (*podmanfork.BranchStats, error) {
	archive, err := f.begin()
	if err != nil {
		return nil, err
	}
	stats := &podmanfork.BranchStats{Call: f.nonce}
	t := time.Now()
	capture, err := f.checkpoint(ctx, archive)
	if err != nil {
		return nil, err
	}
	stats.CheckpointMs = ms(time.Since(t))
	stats.SourcePauseMs = capture.Timings.SourcePauseMs

	// The source runs on from here. A twin capture's pages reach the
	// plan's images once its daemon has drained them out of the twins.
	if capture.Memory == forkopts.MemoryTwin {
		st, err := waitDrained(ctx, f.store, capture.ID)
		if err != nil {
			return nil, err
		}
		stats.CopiedBytes, stats.FromBaseBytes = st.Bytes, st.FromBase
		if st.BaseErr != "" {
			logrus.Warnf("branch of %s: the last branch could not be read (%s); its pages were copied from the source", f.src.Name, st.BaseErr)
		}
		capture.Memory, capture.Snapshots = "", nil
	}
	if runnable != nil {
		b := w.Branch()
		if err := runnable(&b); err != nil {
			return nil, err
		}
		f.runnable = true
	}
	t = time.Now()
	if err := w.AddPlan(ctx, f.planDir); err != nil {
		return nil, err
	}
	if capture.Rootfs != nil {
		// The plan's capture is moved, not copied, unless it is a btrfs
		// subvolume, which only btrfs may remove.
		if err := w.AddTree(ctx, capture.Rootfs.Path, branch.RootfsTree, capture.Rootfs.Kind != rootfs.KindBtrfs); err != nil {
			return nil, err
		}
	}
	for i, v := range capture.Volumes {
		if err := w.AddTree(ctx, v.Snapshot, branch.VolumeTree(i), true); err != nil {
			return nil, err
		}
	}
	// Podman's archive without its copies of /dev/shm and the volumes,
	// made after the capture: the branch has its own.
	small := filepath.Join(f.tmpDir, "branch.tar")
	if err := writeSiblingArchive(archive, small, siblingEdit{}); err != nil {
		return nil, fmt.Errorf("keeping the source's configuration: %w", err)
	}
	if err := w.AddFile(small, branch.ArchiveFile); err != nil {
		return nil, err
	}
	id := readSourceIdentity(f.src)
	engine, err := json.Marshal(branchEngine{Source: f.src, Volumes: f.volumes, Hostname: id.hostname, MachineID: id.machineID})
	if err != nil {
		return nil, err
	}
	b, err := w.Commit(func(b *branch.Branch) {
		b.Labels = opts.Labels
		b.Plan = *capture
		b.Engine = engine
		if f.src.Config != nil {
			b.Parent = f.src.Config.Labels[podmanfork.LabelBranch]
		}
	})
	if errors.Is(err, branch.ErrNameTaken) {
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	if err != nil {
		return nil, err
	}
	stats.Branch = b
	stats.WriteMs = ms(time.Since(t))
	// Durable: the source's write tracking may count on this branch.
	if err := wptrack.Commit(ctx, f.store.TrackDir(), f.src.ID, capture.ID, b.ID); err != nil {
		logrus.Warnf("write tracking: %v (the next branch of %s copies all of its memory)", err, f.src.Name)
	}
	if err := f.finish(); err != nil {
		return nil, err
	}
	return stats, nil
}

// StartBranch starts opts.Count siblings from the branch ref (a name or
// ID), with the same options and all-or-nothing rule as a fork. The
// branch's source need not exist any more; its image must.
func (a *Agent) StartBranch(ctx context.Context, ref string, opts podmanfork.Options) (*podmanfork.Stats, error) {
	start := time.Now()
	if err := normalize(&opts); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	if opts.Memory == forkopts.MemoryCow {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("--memory cow: branch %s holds its memory as page images, which its containers get copies of; start it with --memory lazy or copy", ref))
	}
	store := a.Branches()
	r, err := store.Open(ref)
	if errors.Is(err, branch.ErrNotFound) {
		// One being written is waited for.
		if err = store.WaitDurable(ctx, ref); err == nil {
			r, err = store.Open(ref)
		}
	}
	if errors.Is(err, branch.ErrNotFound) {
		return nil, podmanfork.WithKind(podmanfork.ErrNoSuchSource, err)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b := r.Branch()
	var eng branchEngine
	if err := json.Unmarshal(b.Engine, &eng); err != nil || eng.Source == nil {
		return nil, fmt.Errorf("branch %s was not made by podman container branch create; it cannot start containers", b.Name)
	}
	if err := requireImage(ctx, b); err != nil {
		return nil, err
	}
	var importedVolumes map[string]string
	if b.Imported != nil {
		if importedVolumes, err = importedVolumeDirs(ctx, b, eng.Volumes); err != nil {
			return nil, err
		}
	}
	plans := a.plans()
	collectDeadCalls(ctx, plans)
	limits, err := checkIdentity(opts.Identity, eng.Source)
	if err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	names, err := newNamer(ctx, b.Name, opts)
	if err != nil {
		return nil, err
	}
	f := &forker{opts: opts, src: eng.Source, store: plans, start: start, names: names, branch: b,
		identityLimits: limits, srcID: sourceIdentity{hostname: eng.Hostname, machineID: eng.MachineID}, volumes: eng.Volumes,
		importedVolumes: importedVolumes}
	defer f.cleanupFiles()
	stats, err := f.startBranch(ctx, r)
	if err != nil {
		return nil, f.failed(ctx, "start of branch "+b.Name, err)
	}
	stats.TotalMs = ms(time.Since(start))
	return stats, nil
}

// ImportBranch imports a branch exported by ExportBranch (podman container
// branch export). The archive must be signed by a trusted key (or
// opts.InsecureUnsigned), and the branch's image must be on this host.
func (a *Agent) ImportBranch(ctx context.Context, file string, opts podmanfork.ImportOptions) (*branch.Branch, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	}
	defer f.Close()
	return a.ImportBranchFrom(ctx, f, file, opts)
}

// ImportBranchFrom is ImportBranch of the archive read from in, which what
// names in errors.
func (a *Agent) ImportBranchFrom(ctx context.Context, in io.Reader, what string, opts podmanfork.ImportOptions) (*branch.Branch, error) {
	bopts, err := a.importOptions(ctx, opts)
	if err != nil {
		return nil, err
	}
	b, err := a.Branches().ImportFrom(in, what, bopts)
	if err != nil {
		return nil, importError(err)
	}
	return b, nil
}

// importOptions are the branch store's options of an import: the trust,
// and a branch's image and tree rules checked before anything is written.
func (a *Agent) importOptions(ctx context.Context, opts podmanfork.ImportOptions) (branch.ImportOptions, error) {
	if opts.Name != "" {
		if err := branch.CheckName(opts.Name); err != nil {
			return branch.ImportOptions{}, podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
		}
	}
	trust, err := signing.HostTrust(a.Layout.Keys, a.Layout.TrustedKeys)
	if err != nil {
		return branch.ImportOptions{}, err
	}
	for _, k := range opts.Trust {
		trust.Add(k, "--trust")
	}
	return branch.ImportOptions{
		Name:             opts.Name,
		Trust:            trust,
		InsecureUnsigned: opts.InsecureUnsigned,
		Prepare: func(b *branch.Branch) (branch.TreeRules, error) {
			if err := requireImage(ctx, b); err != nil {
				return branch.TreeRules{}, err
			}
			return imageRules(ctx, b)
		},
	}, nil
}

// importError gives an import's error its kind.
func importError(err error) error {
	switch {
	case errors.Is(err, branch.ErrNotBranchArchive), errors.Is(err, branch.ErrInvalid), errors.Is(err, branch.ErrUntrusted), errors.Is(err, branch.ErrCorrupt):
		return podmanfork.WithKind(podmanfork.ErrInvalidOption, err)
	case errors.Is(err, branch.ErrNameTaken):
		return podmanfork.WithKind(podmanfork.ErrConflict, err)
	}
	return err
}

// ExportBranch writes branch ref to w, signed with this host's key (made
// on first use).
func (a *Agent) ExportBranch(ref string, w io.Writer) (*branch.Branch, error) {
	key, err := signing.HostKey(a.Layout.Keys)
	if err != nil {
		return nil, err
	}
	return a.Branches().ExportTo(ref, w, key)
}

// ExportBranchFile is ExportBranch to a file, written atomically.
func (a *Agent) ExportBranchFile(ref, dest string) (*branch.Branch, error) {
	key, err := signing.HostKey(a.Layout.Keys)
	if err != nil {
		return nil, err
	}
	return a.Branches().Export(ref, dest, key)
}

// requireImage fails, naming it, when the branch's image is not on this
// host: Podman makes each sibling's root filesystem from it.
func requireImage(ctx context.Context, b *branch.Branch) error {
	for _, ref := range []string{b.Source.ImageID, b.Source.Image} {
		if ref == "" {
			continue
		}
		if ok, err := images.Exists(ctx, ref, nil); err == nil && ok {
			return nil
		}
	}
	return podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("branch %s needs image %s (ID %.12s), which this host does not have: pull or load it first",
		b.Name, b.Source.Image, b.Source.ImageID))
}

func (f *forker) startBranch(ctx context.Context, r *branch.Reader) (*podmanfork.Stats, error) {
	archive, err := f.begin()
	if err != nil {
		return nil, err
	}
	stats := &podmanfork.Stats{Source: f.src.ID, Call: f.nonce, Branch: f.branch.ID}
	t := time.Now()
	p, err := f.planFromBranch(ctx, r)
	if err != nil {
		return nil, err
	}
	ref := plan.ReferenceTo(p.ID, f.planDir, f.src.ID)
	base := r.Path(branch.ArchiveFile)
	if f.branch.Imported != nil {
		// Only what a container of its image could have had here.
		trimmed := filepath.Join(f.tmpDir, "imported.tar")
		if err := sanitizeImported(base, trimmed, f.importedVolumes); err != nil {
			return nil, fmt.Errorf("branch %s: %w", f.branch.Name, err)
		}
		base = trimmed
	}
	if err := writeSiblingArchive(base, archive, siblingEdit{Reference: &ref}); err != nil {
		return nil, fmt.Errorf("branch %s: %w", f.branch.Name, err)
	}
	stats.CheckpointMs = ms(time.Since(t))
	stats.Capture = *p
	if err := f.makeSiblings(ctx, archive, stats); err != nil {
		return nil, err
	}
	if err := f.finish(); err != nil {
		return nil, err
	}
	return stats, nil
}

// planFromBranch makes a plan in the host's store from the branch, for
// this call's siblings only.
func (f *forker) planFromBranch(ctx context.Context, r *branch.Reader) (*plan.Plan, error) {
	id := plan.NewID()
	dir := f.store.Dir(id)
	// Recorded first: a rollback then finds whatever exists of it.
	f.planDir = dir
	if err := f.call.Update(func(rec *calls.Record) { rec.PlanDir = dir }); err != nil {
		return nil, err
	}
	if _, err := f.store.CreateDir(id); err != nil {
		return nil, err
	}
	if err := r.WritePlan(dir); err != nil {
		return nil, err
	}
	// The branch's manifest holds the plan: a copy of it, made this
	// call's own.
	p := f.branch.Plan
	p.Volumes = slices.Clone(p.Volumes)
	if f.branch.Imported != nil {
		// Another host's crun root; this host's crun keeps its default.
		p.Source.CrunRoot = ""
	}
	f.crunRoot = p.Source.CrunRoot
	now := time.Now().UTC()
	p.ID, p.CreatedAt, p.ExpiresAt = id, now, now.Add(f.opts.TTL)
	// The source's host paths and process mean nothing to a start.
	p.Source.Bundle, p.Source.Rootfs, p.Source.CgroupPath, p.Source.Pid = "", "", "", 0
	// The start's own choice (StartBranch refused cow): a branch holds
	// page images whatever its capture was.
	p.Memory = f.opts.Memory
	if p.Rootfs != nil {
		snap := *p.Rootfs
		// The layers under the capture are always this host's layers of
		// the branch's image, never the manifest's: those are paths the
		// sibling's root would be made of.
		snap.LowerDirs = nil
		if snap.Kind == rootfs.KindOverlay {
			layers, err := imageLayers(ctx, f.branch.Source.ImageID)
			if err != nil {
				return nil, fmt.Errorf("branch %s: %w", f.branch.Name, err)
			}
			snap.LowerDirs = layers
		}
		snap.Path = filepath.Join(f.store.SnapshotRoot, id)
		if snap.Kind == rootfs.KindBtrfs {
			// A copy is an ordinary directory: overlay-less captures
			// apply the same way from one.
			snap.Kind = rootfs.KindDir
		}
		if err := os.MkdirAll(f.store.SnapshotRoot, 0o700); err != nil {
			return nil, err
		}
		if _, err := rootfs.CopyDir(ctx, r.Path(branch.RootfsTree), snap.Path); err != nil {
			return nil, fmt.Errorf("branch %s: copying its root filesystem: %w", f.branch.Name, err)
		}
		p.Rootfs = &snap
	}
	for i := range p.Volumes {
		dst := filepath.Join(f.store.VolumesDir(id), fmt.Sprint(i))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, err
		}
		if _, err := rootfs.CopyDir(ctx, r.Path(branch.VolumeTree(i)), dst); err != nil {
			return nil, fmt.Errorf("branch %s: copying volume %s: %w", f.branch.Name, p.Volumes[i].Name, err)
		}
		p.Volumes[i].Snapshot = dst
	}
	if err := p.Write(dir); err != nil {
		return nil, err
	}
	client := journal.Self()
	if err := plan.SetUses(dir, f.opts.Count, &client); err != nil {
		return nil, err
	}
	return &p, nil
}

// imageLayers are the directories of image's layers on this host, top
// first: the lower layers of its containers' root filesystems.
func imageLayers(ctx context.Context, image string) ([]string, error) {
	data, err := images.GetImage(ctx, image, nil)
	if err != nil {
		return nil, fmt.Errorf("finding the layers of image %.12s: %w", image, err)
	}
	if data.GraphDriver == nil || data.GraphDriver.Name != "overlay" || data.GraphDriver.Data["UpperDir"] == "" {
		return nil, fmt.Errorf("image %.12s is not stored by the overlay driver here; its branch's root filesystem capture is an overlay layer", image)
	}
	layers := []string{data.GraphDriver.Data["UpperDir"]}
	if lower := data.GraphDriver.Data["LowerDir"]; lower != "" {
		layers = append(layers, strings.Split(lower, ":")...)
	}
	return layers, nil
}

// importedVolumeDirs localizes an imported branch's volumes (see
// localizeVolumes) under this host's volume directory.
func importedVolumeDirs(ctx context.Context, b *branch.Branch, uses []podmanfork.VolumeUse) (map[string]string, error) {
	info, err := system.Info(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("asking Podman where it keeps volumes: %w", err)
	}
	if info.Store == nil || info.Store.VolumePath == "" {
		return nil, fmt.Errorf("podman does not say where it keeps volumes")
	}
	return localizeVolumes(uses, b.Plan.Volumes, info.Store.VolumePath)
}

// waitDrained waits until the daemon of plan id has drained its twins into
// page images, and says what the drain copied.
func waitDrained(ctx context.Context, store plan.Store, id string) (lazypages.DrainState, error) {
	c, err := lazy.Connect(lazy.PathsFor(store.Layout, id))
	if err != nil {
		return lazypages.DrainState{}, err
	}
	defer c.Close()
	st, err := c.WaitDrainedState(ctx)
	if err != nil {
		return st, fmt.Errorf("writing the branch: the capture's twins: %w", err)
	}
	return st, nil
}
