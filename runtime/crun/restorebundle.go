package crun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// PrepareRestore readies a bundle for crun's restore of a checkpoint into
// it: what crun makes when it creates a container, and CRIU cannot do
// without at a restore. It reads config.json once, resolves its bind
// mounts' linked sources (resolveBindSources), writing the file back only
// if one changed, and makes nested mounts' mountpoints (makeNestedMountpoints).
// A bundle without config.json is left to crun, which says what is wrong.
func PrepareRestore(bundle string) error {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	// The mounts twice: as the spec has them, and as written, so that a
	// rewrite keeps every field tclone does not know.
	var mounts []specs.Mount
	var written []map[string]json.RawMessage
	if raw, ok := spec["mounts"]; ok {
		if err := errors.Join(json.Unmarshal(raw, &mounts), json.Unmarshal(raw, &written)); err != nil {
			return fmt.Errorf("reading the mounts of %s: %w", path, err)
		}
	}
	changed, err := resolveBindSources(mounts)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		for _, i := range changed {
			written[i]["source"], _ = json.Marshal(mounts[i].Source)
		}
		if err := rewriteSpec(path, spec, written); err != nil {
			return err
		}
	}
	return makeNestedMountpoints(mounts)
}

// resolveBindSources replaces each bind mount's source that is a symbolic
// link by the path it leads to, which is what the mount binds anyway, and
// says which it changed. A restore needs it: crun hands CRIU every bind
// mount's source as an external mount, and CRIU (mount-v2) clones the
// source without following a link, then fails ("Can't remount ... with
// MS_PRIVATE: Invalid argument"). Podman's --init binds
// /usr/libexec/podman/catatonit, a link on Debian, so every container run
// with --init failed to restore.
func resolveBindSources(mounts []specs.Mount) ([]int, error) {
	var changed []int
	for i, m := range mounts {
		if !bindMount(m) || !filepath.IsAbs(m.Source) {
			continue
		}
		if st, err := os.Lstat(m.Source); err != nil || st.Mode()&os.ModeSymlink == 0 {
			continue
		}
		real, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return nil, fmt.Errorf("bind mount source %s of %s: %w; the container's bind mounts must exist to restore it", m.Source, m.Destination, err)
		}
		mounts[i].Source = real
		changed = append(changed, i)
	}
	return changed, nil
}

// rewriteSpec writes config.json at path back, atomically and with its
// mode, with the mounts as given.
func rewriteSpec(path string, spec map[string]json.RawMessage, mounts []map[string]json.RawMessage) error {
	var err error
	if spec["mounts"], err = json.Marshal(mounts); err != nil {
		return err
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".tclone-tmp"
	if err := os.WriteFile(tmp, out, st.Mode().Perm()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
