package fork

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/procfs"
)

// source is a container that is about to be captured.
type source struct {
	id     string
	state  *crun.State
	status *crun.Status
	spec   *specs.Spec
	// paused is a source its caller paused for the capture (containerd's
	// CRI checkpoint pauses it first, and resumes it after).
	paused bool
}

// frozenBy is the freezer cgroup a paused source is frozen in, which CRIU
// must be told of (it seizes a frozen tree through it, and leaves it
// frozen); "" for a running source, which CRIU holds by ptrace alone.
func (s *source) frozenBy() string {
	if !s.paused {
		return ""
	}
	return cgroups.ProcsDir(s.status.CgroupPath)
}

// SourceError is a container that cannot be forked as it is; it says why and
// what to do.
type SourceError struct {
	ID     string
	Reason string
	Fix    string
}

func (e *SourceError) Error() string {
	return fmt.Sprintf("cannot fork container %s: %s; %s", e.ID, e.Reason, e.Fix)
}

// loadSource checks that id is a running container crun manages and reads
// what a capture needs. A paused one is refused unless callerPaused: its
// caller paused it for this capture.
func loadSource(ctx context.Context, rt *crun.Runtime, id string, callerPaused bool) (*source, error) {
	if id == "" {
		return nil, &SourceError{ID: `""`, Reason: "no source container given", Fix: "name the container to fork"}
	}
	st, err := rt.State(ctx, id)
	if errors.Is(err, crun.ErrNotFound) {
		return nil, &SourceError{ID: id, Reason: "crun has no such container under " + rt.Global.StateRoot(),
			Fix: "check the ID; for a Podman container, it must run with --runtime tclone (podman inspect --format '{{.OCIRuntime}}' shows which)"}
	}
	if err != nil {
		return nil, err
	}
	switch st.Status {
	case crun.StatusRunning:
	case crun.StatusPaused:
		if !callerPaused {
			return nil, &SourceError{ID: id, Reason: "it is paused", Fix: "resume it first (podman unpause, or tclone resume)"}
		}
	default:
		return nil, &SourceError{ID: id, Reason: "it is " + st.Status + ", and only a running container can be forked", Fix: "start it first"}
	}
	if !processAlive(st.Pid) {
		return nil, &SourceError{ID: id, Reason: fmt.Sprintf("its init process %d is exiting", st.Pid), Fix: "wait for the container to stop, then restart it"}
	}
	status, err := rt.ReadStatus(id)
	if err != nil {
		return nil, err
	}
	spec, err := loadSpec(st.Bundle)
	if err != nil {
		return nil, err
	}
	switch {
	case status.Rootfs == "":
		status.Rootfs = rootPath(st.Bundle, spec)
	case !filepath.IsAbs(status.Rootfs):
		// crun records the root as the config gave it, relative to the
		// bundle for bare bundles.
		status.Rootfs = filepath.Join(st.Bundle, status.Rootfs)
	}
	return &source{id: id, state: st, status: status, spec: spec, paused: st.Status == crun.StatusPaused}, nil
}

// processAlive reports whether pid runs; a zombie ('Z') or dead ('X') init
// is a container on its way out.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := procfs.ReadStat(pid)
	return err == nil && !st.Exited()
}

// loadSpec reads a bundle's config.json.
func loadSpec(bundle string) (*specs.Spec, error) {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading bundle config: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return nil, fmt.Errorf("%s has no root.path", path)
	}
	if spec.Linux == nil {
		return nil, fmt.Errorf("%s has no linux section; tclone forks Linux containers only", path)
	}
	return &spec, nil
}

// rootPath resolves the spec's root.path against its bundle.
func rootPath(bundle string, spec *specs.Spec) string {
	if filepath.IsAbs(spec.Root.Path) {
		return spec.Root.Path
	}
	return filepath.Join(bundle, spec.Root.Path)
}

// namespacePath returns the path a spec gives for namespace type t, and
// whether the spec has that namespace at all.
func namespacePath(spec *specs.Spec, t specs.LinuxNamespaceType) (string, bool) {
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == t {
			return ns.Path, true
		}
	}
	return "", false
}
