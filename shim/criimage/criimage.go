// Package criimage writes containerd's CRI checkpoint archive (what
// `crictl checkpoint --export` writes, and the kubelet's checkpoint API
// leaves on the node) as an OCI checkpoint image: an image of one layer
// holding the archive's files, annotated so that containerd's CRI restores
// a container from it (it reads org.criu.checkpoint.container.name). It
// travels through any registry, and a container whose image it is starts
// restored. (CRI-O restores only archives CRI-O made: it reads its own
// annotations from spec.dump, which containerd's has not.)
//
// The image is written as an OCI image archive (an OCI image layout in a
// tar, "oci-archive"), which `ctr images import` takes.
package criimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/distribution/reference"

	"github.com/tclone/tclone/runtime/plan"
)

// The annotations of a checkpoint image.
const (
	// AnnotationName is the checkpointed container's name: containerd's
	// CRI restores from an image that has it.
	AnnotationName = "org.criu.checkpoint.container.name"
	// The others describe where the checkpoint was taken (checkpointctl's
	// names; the runtime is the OCI runtime).
	AnnotationPod         = "org.criu.checkpoint.pod.name"
	AnnotationNamespace   = "org.criu.checkpoint.pod.namespace"
	AnnotationRootfsImage = "org.criu.checkpoint.rootfsImageName"
	AnnotationEngine      = "org.criu.checkpoint.engine.name"
	AnnotationRuntime     = "org.criu.checkpoint.runtime.name"
	AnnotationHostArch    = "org.criu.checkpoint.host.arch"
	AnnotationHostKernel  = "org.criu.checkpoint.host.kernel"
)

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	// annotationImageName names the image in containerd's store on
	// import; annotationRefName is the OCI layout's tag.
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Name is ref normalized as a tagged image name (":latest" when it has no
// tag), the name the image gets; a digest, which names content not yet
// written, is refused.
func Name(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image name %q: %w", ref, err)
	}
	if _, ok := named.(reference.Digested); ok {
		return "", fmt.Errorf("image name %q: a digest names an image that exists; give a name and a tag for the new one", ref)
	}
	return reference.TagNameOnly(named).String(), nil
}

// Image is a checkpoint image written.
type Image struct {
	// Name is the image's normalized name (Name).
	Name string `json:"name"`
	// Digest is its manifest's, by which a registry serves it.
	Digest string `json:"digest"`
	// LayerBytes is the size of its one layer (uncompressed).
	LayerBytes int64 `json:"layer_bytes"`
}

// Write writes to w an OCI image archive of the one image ref (Name),
// whose layer is the CRI checkpoint archive at layer (a tar; it must hold
// the CRI's spec.dump and config.dump) and whose manifest carries the
// annotations that have a value (AnnotationName is required).
func Write(w io.Writer, ref, layer string, annotations map[string]string) (*Image, error) {
	name, err := Name(ref)
	if err != nil {
		return nil, err
	}
	annotations = maps.Clone(annotations)
	maps.DeleteFunc(annotations, func(_, v string) bool { return v == "" })
	if annotations[AnnotationName] == "" {
		return nil, errors.New("a checkpoint image needs the container's name (" + AnnotationName + ")")
	}
	if err := checkArchive(layer); err != nil {
		return nil, err
	}
	f, err := os.Open(layer)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint archive: %w", err)
	}
	layerDigest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	config, err := json.Marshal(map[string]any{
		"created":      time.Now().UTC().Format(time.RFC3339Nano),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history":      []map[string]any{{"created_by": "tclone kube checkpoint", "comment": "a CRI checkpoint archive"}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: digestOf(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: layerDigest, Size: size}},
		"annotations":   annotations,
	})
	if err != nil {
		return nil, err
	}
	named, _ := reference.ParseNormalizedNamed(name)
	tag := ""
	if t, ok := named.(reference.Tagged); ok {
		tag = t.Tag()
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests": []descriptor{{MediaType: mediaManifest, Digest: digestOf(manifest), Size: int64(len(manifest)),
			Annotations: map[string]string{annotationImageName: name, annotationRefName: tag}}},
	})
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(digestOf(manifest)), manifest},
		{blobPath(digestOf(config)), config},
	} {
		if err := writeEntry(tw, e.name, int64(len(e.data)), bytes.NewReader(e.data)); err != nil {
			return nil, err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if err := writeEntry(tw, blobPath(layerDigest), size, f); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &Image{Name: name, Digest: digestOf(manifest), LayerBytes: size}, nil
}

// checkArchive refuses a layer that is not a CRI checkpoint archive: a tar
// holding spec.dump, config.dump and the checkpoint directory, with
// nothing but regular files and directories (containerd's restore refuses
// anything else), and no fork plan's reference (a fork's checkpoint is
// node-local).
func checkArchive(archive string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	seen := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s is not a CRI checkpoint archive: %w", archive, err)
		}
		name := cleanName(h.Name)
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		default:
			return fmt.Errorf("%s: %s is neither a file nor a directory, which the CRI's restore refuses", archive, h.Name)
		}
		if name == path.Join("checkpoint", plan.ReferenceFile) {
			return fmt.Errorf("%s is a fork's checkpoint, which refers to a plan in this node's memory: an image needs an ordinary checkpoint", archive)
		}
		seen[name] = true
	}
	for _, want := range []string{"spec.dump", "config.dump", "checkpoint"} {
		if !seen[want] {
			return fmt.Errorf("%s is not a CRI checkpoint archive: it has no %s", archive, want)
		}
	}
	return nil
}

// cleanName is a tar entry's name without "./" or a trailing slash.
func cleanName(name string) string {
	name = path.Clean(strings.TrimPrefix(name, "./"))
	return strings.TrimPrefix(name, "/")
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(digest string) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:")
}

func writeEntry(tw *tar.Writer, name string, size int64, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, r, size); err != nil {
		return fmt.Errorf("writing %s into the image archive: %w", name, err)
	}
	return nil
}
