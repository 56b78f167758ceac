package kubefork

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/criimage"
)

// ImageOptions are a checkpoint of a pod's container written as an OCI
// checkpoint image (criimage) into the node's containerd, and pushed.
type ImageOptions struct {
	// Node is the node's CRI; its endpoint must be containerd's unix
	// socket, which ctr reaches too.
	Node
	// Image names the image (a tag; ":latest" when none is given). It
	// must not exist on the node.
	Image string
	// Push pushes it to its registry once it is in containerd; PlainHTTP
	// talks to that registry over plain HTTP, HostsDir is containerd's
	// registry configuration (hosts.toml per registry, as the node's
	// containerd reads it).
	Push      bool
	PlainHTTP bool
	HostsDir  string
	// Timeout bounds the CRI's checkpoint call (default 10 minutes).
	Timeout time.Duration
	// Store is tclone's store on this node.
	Store plan.Store
}

// ImageResult is a checkpoint image made.
type ImageResult struct {
	Source Pod            `json:"source"`
	Image  criimage.Image `json:"image"`
	Pushed bool           `json:"pushed"`
	// CheckpointMs is the CRI's checkpoint call (the container is paused
	// for all of it: an ordinary checkpoint), ImageMs the image's writing
	// and import into containerd, PushMs its push.
	CheckpointMs float64 `json:"checkpoint_ms"`
	ImageMs      float64 `json:"image_ms"`
	PushMs       float64 `json:"push_ms,omitempty"`
	TotalMs      float64 `json:"total_ms"`
}

// containerdNamespace is the containerd namespace of the CRI's images.
const containerdNamespace = "k8s.io"

func (o *ImageOptions) check() error {
	if err := o.Node.defaults(); err != nil {
		return err
	}
	if o.Image == "" {
		return errors.New("no image named: give --image NAME[:TAG]")
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if _, ok := o.ctr(); !ok {
		return fmt.Errorf("CRI endpoint %q: a checkpoint image goes into containerd through its socket, unix:///PATH (unix:///run/containerd/containerd.sock for the node's containerd)", o.Endpoint)
	}
	return nil
}

// CheckpointImage checkpoints the running container of target
// ("POD/CONTAINER", or "POD" for a pod with one container) through the
// CRI, as the kubelet's checkpoint API does (an ordinary, portable
// checkpoint), and writes the CRI's archive as a checkpoint image in the
// node's containerd, from which the CRI restores a new container on any
// node the image reaches. All or nothing: a failure leaves no image.
func CheckpointImage(ctx context.Context, target string, opts ImageOptions) (*ImageResult, error) {
	start := time.Now()
	if err := opts.check(); err != nil {
		return nil, err
	}
	name, err := criimage.Name(opts.Image)
	if err != nil {
		return nil, fmt.Errorf("--image: %w", err)
	}
	cri := opts.cri()
	src, err := cri.findContainer(ctx, opts.Namespace, target, "checkpoint")
	if err != nil {
		return nil, err
	}
	res := &ImageResult{Source: src.describe(opts.Namespace)}
	if exists, err := cri.imageExists(ctx, name); err != nil || exists {
		if err == nil {
			err = fmt.Errorf("image %s exists on this node: remove it first (crictl rmi %s) or name another", name, name)
		}
		return nil, err
	}
	ctr, _ := opts.ctr()
	work, err := calls.MkdirTemp(opts.Store, "tclone-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	archive := filepath.Join(work, "checkpoint.tar")
	began := time.Now()
	if err := ordinaryCheckpoint(ctx, cri, ctr, opts, src.ctr.ID, archive); err != nil {
		return nil, err
	}
	res.CheckpointMs = ms(time.Since(began))
	cfg, err := readArchiveJSON[checkpointConfig](archive, "config.dump")
	if err != nil {
		return nil, err
	}
	annotations := map[string]string{
		criimage.AnnotationName:        res.Source.Container,
		criimage.AnnotationPod:         res.Source.Name,
		criimage.AnnotationNamespace:   opts.Namespace,
		criimage.AnnotationRootfsImage: cfg.RootfsImageName,
		criimage.AnnotationEngine:      "containerd",
		criimage.AnnotationHostArch:    runtime.GOARCH,
		criimage.AnnotationHostKernel:  kernelRelease(),
	}
	if bin := src.ci.Info.RuntimeOptions.BinaryName; bin != "" {
		annotations[criimage.AnnotationRuntime] = filepath.Base(bin)
	}
	began = time.Now()
	img, err := ctr.importImage(ctx, name, archive, annotations)
	if err != nil {
		return nil, err
	}
	res.Image, res.ImageMs = *img, ms(time.Since(began))
	if opts.Push {
		began = time.Now()
		if err := ctr.push(ctx, name, opts.PlainHTTP, opts.HostsDir); err != nil {
			return nil, errors.Join(err, ctr.remove(name))
		}
		res.Pushed, res.PushMs = true, ms(time.Since(began))
	}
	res.TotalMs = ms(time.Since(start))
	return res, nil
}

// ordinaryCheckpoint has the CRI checkpoint container id into archive, as
// the kubelet's checkpoint API does: no fork request of tclone's may be
// pending for it then (a fork's checkpoint refers to a plan in this node's
// memory, and travels nowhere).
func ordinaryCheckpoint(ctx context.Context, cri crictl, ctr ctrTool, opts ImageOptions, id, archive string) error {
	// What dead fork clients left goes first: their requests among it.
	if _, err := opts.Store.CollectIntents(); err != nil {
		logrus.Warnf("collecting fork requests nobody will use: %v", err)
	}
	// A fork holds this lock from its request until its checkpoint
	// returns.
	unlock, err := opts.Store.LockIntents(id)
	if err != nil {
		return fmt.Errorf("this must run on the pod's node, as root: %w", err)
	}
	defer unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	// containerd pauses the container for the call and resumes it when
	// the call ends, but not when it ends on its deadline: the container
	// is resumed here then, unless it was paused before.
	before, err := ctr.taskStatus(ctx, id)
	if err != nil {
		return err
	}
	// The call runs to its end whatever becomes of this process (a
	// cancelled call skips containerd's resume too).
	if _, err := cri.runToEnd("--timeout", opts.Timeout.String(), "checkpoint", "--export", archive, id); err != nil {
		if before != "PAUSED" {
			err = errors.Join(err, ctr.resumeIfPaused(id))
		}
		return err
	}
	return nil
}

// checkpointConfig is what a checkpoint image takes of the CRI's
// config.dump (checkpointctl's ContainerConfig).
type checkpointConfig struct {
	RootfsImageName string `json:"rootfsImageName"`
	RootfsImageRef  string `json:"rootfsImageRef"`
}

// readArchiveJSON decodes the JSON file name of a CRI checkpoint archive.
func readArchiveJSON[T any](archive, name string) (*T, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("the CRI's checkpoint archive has no %s", name)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the CRI's checkpoint archive: %w", err)
		}
		if strings.TrimPrefix(h.Name, "./") != name {
			continue
		}
		var v T
		if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&v); err != nil {
			return nil, fmt.Errorf("the CRI's checkpoint archive: %s: %w", name, err)
		}
		return &v, nil
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
