package hostagent

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containers/buildah/define"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/containers/podman/v5/pkg/domain/entities/types"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/pagedelta"
	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
	"github.com/tclone/tclone/shim/podmanfork"
)

// A checkpoint image is Podman's way to carry a checkpoint through a
// registry (podman container checkpoint --create-image): an OCI image of one
// layer holding the files of an exported checkpoint, with annotations that
// describe the host it was taken on. `podman container restore IMAGE` and
// CRI-O restore from one. Its files:
//
//	checkpoint/            CRIU's images, every page included
//	config.dump spec.dump  the container's configuration
//	network.status         its network at the capture
//	rootfs-diff.tar        its root filesystem changes over the image,
//	deleted.files          and the image's files it deleted
//	devshm-checkpoint.tar  its /dev/shm
//	volumes/NAME.tar       its named volumes
const (
	networkStatus = "network.status"
	rootfsDiffTar = "rootfs-diff.tar"
	deletedFiles  = "deleted.files"
	checkpointDir = "checkpoint"
	// imageBranchDir holds the branch as branch.ExportUnpacked writes it,
	// and imagePlanDir its plan files but the CRIU images: Podman's
	// restore reads neither.
	imageBranchDir = "tclone/branch"
	imagePlanDir   = "tclone/plan"
)

// imagePlanFile is where a checkpoint image's layer dir keeps the plan
// file that a branch's manifest names rel.
func imagePlanFile(dir, rel string) string {
	own := filepath.Join(dir, imagePlanDir, rel)
	if _, err := os.Lstat(own); err == nil {
		return own
	}
	if images, ok := strings.CutPrefix(rel, "images/"); ok {
		return filepath.Join(dir, checkpointDir, images)
	}
	return own
}

// copyRegular copies the regular file src to dst, which must not exist.
func copyRegular(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o600)
}

// restoreRuntime is the runtime a checkpoint image is made for.
const restoreRuntime = "crun"

// Podman's checkpoint image annotations (libpod/define), and tclone's own.
const (
	annotationCheckpointName = "io.podman.annotations.checkpoint.name"
	annotationPrefix         = "io.podman.annotations.checkpoint."
	// AnnotationBranch names the branch an image was exported from.
	AnnotationBranch = "io.tclone.branch"
	// AnnotationRestoreFlags are the flags `podman container restore`
	// needs for the image (what the capture dumped).
	AnnotationRestoreFlags = "io.tclone.restore-flags"
)

// ImageExport is a branch written as a checkpoint image.
type ImageExport struct {
	Image  string `json:"image"`
	ID     string `json:"id"`
	Branch string `json:"branch"`
	// Bytes is the size of the image's one layer, uncompressed.
	Bytes int64 `json:"bytes"`
	// RestoreFlags are what `podman container restore` of the image needs.
	RestoreFlags []string `json:"restore_flags,omitempty"`
	// Delta is set on an image written over a parent image
	// (--parent-image): Bytes are then its own layer's.
	Delta *DeltaStats `json:"delta,omitempty"`
	// Notes say what the image does not carry.
	Notes  []string `json:"notes,omitempty"`
	TookMs float64  `json:"took_ms"`
}

// ExportBranchImage writes branch ref as the checkpoint image named image
// in the local image store of the Podman service ctx is connected to.
// Push it with podman push; restore it with stock podman container restore
// (with the image's RestoreFlags), or import it as a branch with
// ImportBranchImage. Only the branch's own files go into it: the image its
// root filesystem sits on is named, not included. With parentImage, a
// full checkpoint image this host exported of an earlier branch of the same
// container, the image is that one and a layer of what changed since (see
// checkpointdelta.go), so that a registry holding the parent stores and
// serves only the change.
func (a *Agent) ExportBranchImage(ctx context.Context, ref, image, parentImage string) (*ImageExport, error) {
	start := time.Now()
	if image == "" {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, errors.New("--image needs an image name, for example localhost:5000/workspace:b1"))
	}
	r, err := a.Branches().Open(ref)
	if errors.Is(err, branch.ErrNotFound) {
		return nil, podmanfork.WithKind(podmanfork.ErrNoSuchSource, err)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b := r.Branch()
	switch {
	case b.Imported != nil:
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("branch %s was imported from another host: export it as an image from the host that took it", b.Name))
	case b.Plan.FilesOnly:
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("branch %s holds files only, no processes: a checkpoint image is a checkpoint of processes", b.Name))
	case b.Plan.Rootfs != nil && b.Plan.Rootfs.Kind != rootfs.KindOverlay:
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("branch %s captured a %s root filesystem: a checkpoint image carries changes over an image (an overlay root, as Podman's containers have)", b.Name, b.Plan.Rootfs.Kind))
	}
	var parent *imageParent
	if parentImage != "" {
		if parent, err = a.openImageParent(ctx, b, parentImage); err != nil {
			return nil, err
		}
		defer parent.close()
	}
	tmp, err := calls.MkdirTemp(a.plans(), "tclone-fork-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	layer := filepath.Join(tmp, "layer")
	if err := os.Mkdir(layer, 0o700); err != nil {
		return nil, err
	}
	x := &ImageExport{Image: image, Branch: b.Name}
	cfg, err := a.writeCheckpointLayer(ctx, r, layer, x)
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", b.Name, err)
	}
	files, err := layerDigests(layer)
	if err != nil {
		return nil, err
	}
	from, labels := "scratch", []string{AnnotationBranch + "=" + b.ID}
	if parent != nil {
		if x.Delta, err = writeDelta(layer, tmp, parent, files); err != nil {
			return nil, fmt.Errorf("branch %s over image %s: %w", b.Name, parent.name, err)
		}
		from = parent.id
		labels = append(labels, AnnotationParentImage+"="+parent.id)
	}
	if x.Bytes, err = dirBytes(layer); err != nil {
		return nil, err
	}
	annotations, err := checkpointAnnotations(ctx, b, cfg, x.RestoreFlags)
	if err != nil {
		return nil, err
	}
	containerfile := filepath.Join(tmp, "Containerfile")
	if err := os.WriteFile(containerfile, []byte("FROM "+from+"\nCOPY . /\n"), 0o600); err != nil {
		return nil, err
	}
	var buildLog strings.Builder
	report, err := images.Build(ctx, []string{containerfile}, types.BuildOptions{BuildOptions: define.BuildOptions{
		ContextDirectory: layer,
		Output:           image,
		OutputFormat:     define.OCIv1ImageManifest,
		Annotations:      annotations,
		Labels:           labels,
		Out:              &buildLog,
		Err:              &buildLog,
		ReportWriter:     &buildLog,
		Quiet:            true,
	}})
	if err != nil {
		return nil, fmt.Errorf("building checkpoint image %s: %w: %s", image, err, strings.TrimSpace(buildLog.String()))
	}
	x.ID = report.ID
	if parent == nil {
		// What a later export writes a delta over.
		if err := a.Branches().RecordImage(b, &branch.ImageRecord{ImageID: x.ID, Files: files}); err != nil {
			x.Notes = append(x.Notes, fmt.Sprintf("this host could not record what the image holds (%v): it cannot be the --parent-image of a later export", err))
		}
	}
	x.TookMs = ms(time.Since(start))
	return x, nil
}

// writeCheckpointLayer fills dir with the checkpoint image's files and
// returns the source's configuration it copied.
func (a *Agent) writeCheckpointLayer(ctx context.Context, r *branch.Reader, dir string, x *ImageExport) (*podmanConfig, error) {
	b := r.Branch()
	planDir := filepath.Join(filepath.Dir(dir), "plan")
	if err := os.Mkdir(planDir, 0o700); err != nil {
		return nil, err
	}
	if err := r.WritePlan(planDir); err != nil {
		return nil, err
	}
	if err := os.Rename(plan.ImagesDir(planDir), filepath.Join(dir, checkpointDir)); err != nil {
		return nil, fmt.Errorf("its CRIU images: %w", err)
	}
	// tclone's own record of the branch, signed, for podman container
	// branch import --image: the plan's other files, and the branch
	// without the files above.
	if err := os.MkdirAll(filepath.Join(dir, imageBranchDir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Rename(planDir, filepath.Join(dir, imagePlanDir)); err != nil {
		return nil, err
	}
	// Podman's restore cannot pass CRIU's tcp-close, which the inventory
	// of a dump that used it demands: Podman's copy of the inventory goes
	// without it where that changes nothing; tclone's keeps the original
	// (the signed manifest's), which imagePlanFile prefers.
	inventory := filepath.Join(dir, checkpointDir, "inventory.img")
	kept := filepath.Join(dir, imagePlanDir, "images", "inventory.img")
	if err := os.MkdirAll(filepath.Dir(kept), 0o700); err != nil {
		return nil, err
	}
	if err := copyRegular(inventory, kept); err != nil {
		return nil, err
	}
	connections, err := criuhooks.ClearTCPClose(filepath.Join(dir, checkpointDir))
	if err != nil {
		return nil, err
	}
	if connections > 0 {
		x.Notes = append(x.Notes, fmt.Sprintf("the branch holds %d established TCP connections, dumped to be restored closed (CRIU's tcp-close): podman container restore cannot ask for that and fails; import the image as a branch instead", connections))
	}
	key, err := signing.HostKey(a.Layout.Keys)
	if err != nil {
		return nil, err
	}
	if _, err := a.Branches().ExportUnpacked(b.ID, filepath.Join(dir, imageBranchDir), key); err != nil {
		return nil, err
	}
	cfg, err := copyConfiguration(r.Path(branch.ArchiveFile), dir)
	if err != nil {
		return nil, err
	}
	if b.Plan.Rootfs != nil {
		layers, err := imageLayers(ctx, b.Source.ImageID)
		if err != nil {
			return nil, err
		}
		if err := writeRootfsDiff(r.Path(branch.RootfsTree), layers, dir); err != nil {
			return nil, err
		}
	}
	copied := map[string]bool{}
	for i, v := range b.Plan.Volumes {
		dst := ""
		switch {
		case v.Name == "/dev/shm":
			dst = filepath.Join(dir, devShmTar)
		case slices.Contains(cfg.volumeNames(), v.Name):
			dst = filepath.Join(dir, volumesDir, v.Name+".tar")
			copied[v.Name] = true
		default:
			x.Notes = append(x.Notes, fmt.Sprintf("the copy of host directory %s is not in the image (a restore mounts the restoring host's)", v.Destination))
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, err
		}
		if err := tarDir(r.Path(branch.VolumeTree(i)), dst); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	flags, missing := b.Plan.Capture.PodmanRestoreFlags()
	x.RestoreFlags = flags
	for _, m := range missing {
		if m == "tcp-close" {
			continue // above
		}
		x.Notes = append(x.Notes, fmt.Sprintf("the capture used CRIU's %s, which podman container restore cannot ask for: import the image as a branch instead", m))
	}
	for _, name := range cfg.volumeNames() {
		if !copied[name] {
			x.Notes = append(x.Notes, fmt.Sprintf("volume %s was shared, not copied, by the branch: the image does not hold it, and its restore needs --ignore-volumes", name))
			if !slices.Contains(x.RestoreFlags, "--ignore-volumes") {
				x.RestoreFlags = append(x.RestoreFlags, "--ignore-volumes")
			}
		}
	}
	return cfg, nil
}

// podmanConfig is what an export reads of libpod's container
// configuration.
type podmanConfig struct {
	Name            string `json:"name"`
	RawImageName    string `json:"RawImageName"`
	RootfsImageID   string `json:"rootfsImageID"`
	RootfsImageName string `json:"rootfsImageName"`
	NamedVolumes    []struct {
		Name string `json:"volumeName"`
	} `json:"namedVolumes"`
}

func (c *podmanConfig) volumeNames() []string {
	var out []string
	for _, v := range c.NamedVolumes {
		out = append(out, v.Name)
	}
	return out
}

// copyConfiguration writes the source's configuration from the branch's
// checkpoint archive into dir. The container's runtime is left for the
// restoring host to choose (its default): the images are CRIU's, which any
// runtime that restores checkpoints restores.
func copyConfiguration(archivePath, dir string) (*podmanConfig, error) {
	var cfg *podmanConfig
	err := walkArchive(archivePath, func(h *tar.Header, r io.Reader) error {
		name := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || (name != configDump && name != specDump && name != networkStatus) {
			return nil
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if name == configDump {
			var raw map[string]any
			if err := json.Unmarshal(data, &raw); err != nil {
				return err
			}
			delete(raw, "runtime")
			if data, err = json.Marshal(raw); err != nil {
				return err
			}
			cfg = &podmanConfig{}
			if err := json.Unmarshal(data, cfg); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(dir, name), data, 0o600)
	})
	if err == nil && cfg == nil {
		err = fmt.Errorf("its checkpoint archive has no %s", configDump)
	}
	return cfg, err
}

// writeRootfsDiff writes the overlay capture upper, over the image layers
// lowers, as Podman's rootfs-diff.tar and deleted.files in dir.
func writeRootfsDiff(upper string, lowers []string, dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, rootfsDiffTar), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	deleted, err := rootfs.WriteLayerDiff(upper, lowers, tw)
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("its root filesystem: %w", err)
	}
	if len(deleted) == 0 {
		return nil
	}
	data, err := json.Marshal(deleted)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, deletedFiles), data, 0o600)
}

// tarDir writes the contents of directory src as a tar file dst, as
// Podman's checkpoints hold a volume or /dev/shm.
func tarDir(src, dst string) error {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	_, err = rootfs.WriteLayerDiff(src, nil, tw)
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkpointAnnotations are Podman's annotations of a checkpoint image,
// describing this host as Podman's own export does, and tclone's.
func checkpointAnnotations(ctx context.Context, b *branch.Branch, cfg *podmanConfig, restoreFlags []string) ([]string, error) {
	info, err := system.Info(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("asking Podman about this host: %w", err)
	}
	a := map[string]string{
		annotationCheckpointName:                  cfg.Name,
		annotationPrefix + "rawImageName":         cfg.RawImageName,
		annotationPrefix + "rootfsImageID":        cfg.RootfsImageID,
		annotationPrefix + "rootfsImageName":      cfg.RootfsImageName,
		annotationPrefix + "podman.version":       info.Version.Version,
		annotationPrefix + "criu.version":         criuVersionNumber(b.Plan.Criu),
		annotationPrefix + "host.arch":            info.Host.Arch,
		annotationPrefix + "host.kernel":          info.Host.Kernel,
		annotationPrefix + "cgroups.version":      info.Host.CgroupsVersion,
		annotationPrefix + "distribution.name":    info.Host.Distribution.Distribution,
		annotationPrefix + "distribution.version": info.Host.Distribution.Version,
		AnnotationBranch:                          b.ID,
		AnnotationRestoreFlags:                    strings.Join(restoreFlags, " "),
	}
	// Podman's restore insists that this names the restoring host's
	// default runtime. The images are CRIU's, dumped for crun's restore
	// (tclone's siblings are restored by crun): crun it is. A host whose
	// default is another restores with podman --runtime crun.
	a[annotationPrefix+"runtime.name"] = restoreRuntime
	if rt := info.Host.OCIRuntime; rt != nil && rt.Name == restoreRuntime {
		a[annotationPrefix+"runtime.version"] = rt.Version
	}
	if c := info.Host.Conmon; c != nil {
		a[annotationPrefix+"conmon.version"] = c.Version
	}
	out := make([]string, 0, len(a))
	for k, v := range a {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

// criuVersionNumber is CRIU's version as Podman writes it: 4.2.1 is 40201.
func criuVersionNumber(v string) string {
	n := 0
	parts := strings.SplitN(strings.TrimSpace(v), ".", 3)
	for i, scale := range []int{10000, 100, 1} {
		if i < len(parts) {
			d, _ := strconv.Atoi(strings.TrimFunc(parts[i], func(r rune) bool { return r < '0' || r > '9' }))
			n += d * scale
		}
	}
	return strconv.Itoa(n)
}

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

// ImportBranchImage imports the checkpoint image image, written by
// ExportBranchImage on some host, as a branch, with the checks and the
// trust an archive's import has (ImportBranch): its signature must be by a
// key this host trusts. The image is pulled when this host lacks it.
func (a *Agent) ImportBranchImage(ctx context.Context, image string, opts podmanfork.ImportOptions) (*branch.Branch, error) {
	bopts, err := a.importOptions(ctx, opts)
	if err != nil {
		return nil, err
	}
	if ok, err := images.Exists(ctx, image, nil); err != nil {
		return nil, err
	} else if !ok {
		if _, err := images.Pull(ctx, image, new(images.PullOptions).WithQuiet(true).WithSkipTLSVerify(opts.SkipTLSVerify)); err != nil {
			return nil, podmanfork.WithKind(podmanfork.ErrNoSuchSource, fmt.Errorf("image %s is not on this host, and pulling it failed (pull it yourself, with the options its registry needs): %w", image, err))
		}
	}
	tmp, err := calls.MkdirTemp(a.plans(), "tclone-fork-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	layer := filepath.Join(tmp, "layer")
	if err := unpackImage(ctx, image, tmp, layer); err != nil {
		return nil, err
	}
	if err := assembleDelta(layer); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("image %s: its memory over its parent image's: %w", image, err))
	}
	meta := filepath.Join(layer, imageBranchDir)
	if _, err := os.Stat(filepath.Join(meta, "branch.json")); err != nil {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("image %s is no checkpoint image written by podman container branch export --image (it has no %s): if it is a checkpoint image of Podman's, restore it with podman container restore", image, imageBranchDir))
	}
	b, err := a.Branches().ImportUnpacked(meta, func(rel string) string { return imagePlanFile(layer, rel) }, "image "+image, bopts)
	if err != nil {
		return nil, importError(err)
	}
	return b, nil
}

// unpackImage extracts the layer of image into layer (which must not
// exist), through tmp: its one layer, or the union of the two of a delta
// checkpoint image (labelled AnnotationParentImage). A checkpoint image has
// regular files only, but for the links to its parent's pages images a
// delta's CRIU images have (pagedelta); anything else in it is refused.
func unpackImage(ctx context.Context, image, tmp, layer string) error {
	data, err := images.GetImage(ctx, image, nil)
	if err != nil {
		return fmt.Errorf("reading image %s: %w", image, err)
	}
	want := 1
	if data.Labels[AnnotationParentImage] != "" {
		want = 2
	}
	saved := filepath.Join(tmp, "image.tar")
	f, err := os.OpenFile(saved, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	format := "docker-archive"
	if err := images.Export(ctx, []string{image}, f, new(images.ExportOptions).WithFormat(format)); err != nil {
		return fmt.Errorf("reading image %s: %w", image, err)
	}
	var manifest []struct{ Layers []string }
	layers := map[string][2]int64{} // offset and size in saved
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading image %s: %w", image, err)
		}
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&manifest); err != nil {
				return fmt.Errorf("image %s: its manifest: %w", image, err)
			}
			continue
		}
		if h.Typeflag == tar.TypeReg {
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return err
			}
			layers[path.Clean(h.Name)] = [2]int64{off, h.Size}
		}
	}
	if len(manifest) != 1 || len(manifest[0].Layers) != want {
		n := 0
		for _, m := range manifest {
			n += len(m.Layers)
		}
		return podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("image %s is no checkpoint image written by podman container branch export --image: it has %d layers, where those have %d", image, n, want))
	}
	for i, name := range manifest[0].Layers {
		at, ok := layers[path.Clean(name)]
		if !ok {
			return fmt.Errorf("image %s: its layer %s is missing", image, name)
		}
		dst := layer
		if i > 0 {
			dst = fmt.Sprintf("%s.%d", layer, i)
		}
		if err := rootfs.LayerFromDiff(io.NewSectionReader(f, at[0], at[1]), nil, dst); err != nil {
			return podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("image %s: %w", image, err))
		}
		if err := checkLayerFiles(image, dst); err != nil {
			return err
		}
		if i > 0 {
			if err := mergeLayer(dst, layer); err != nil {
				return fmt.Errorf("image %s: %w", image, err)
			}
		}
	}
	return nil
}

// checkLayerFiles refuses what no checkpoint image's layer holds: anything
// but directories, regular files, and a delta's links to its parent's pages
// images. A link of another kind would have the import read what it
// points to, outside the layer.
func checkLayerFiles(image, layer string) error {
	return filepath.WalkDir(layer, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(layer, p)
		if d.Type()&os.ModeSymlink != 0 {
			if target, err := os.Readlink(p); err == nil && pagedelta.CheckParentLink(checkpointDir, filepath.ToSlash(rel), target) {
				return nil
			}
		}
		return podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("image %s holds %s, which is neither a directory nor a regular file: no checkpoint image does", image, rel))
	})
}

// mergeLayer moves the files of layer top over those of lower: the union
// of two layers that hold no whiteouts (a build's COPY writes none).
func mergeLayer(top, lower string) error {
	err := filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(top, p)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(lower, rel)
		if d.IsDir() {
			if fi, err := os.Lstat(dst); err == nil && !fi.IsDir() {
				return fmt.Errorf("%s is a directory in its top layer and a file below", rel)
			}
			return os.MkdirAll(dst, 0o700)
		}
		if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a file in its top layer and a directory below", rel)
		}
		return os.Rename(p, dst)
	})
	if err != nil {
		return err
	}
	return os.RemoveAll(top)
}
