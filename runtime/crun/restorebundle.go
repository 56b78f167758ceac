package crun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// PrepareRestore readies a bundle for crun's restore of a checkpoint
// into it: what crun makes when it creates a container, and CRIU cannot
// do without at a restore (ResolveBindSources, MakeNestedMountpoints).
func PrepareRestore(bundle string) error {
	if err := ResolveBindSources(bundle); err != nil {
		return err
	}
	return MakeNestedMountpoints(bundle)
}

// ResolveBindSources rewrites the bundle's config.json so that no bind
// mount's source is a symbolic link: each such source is replaced by the
// path it leads to, which is what the mount binds anyway. A restore needs
// it: crun hands CRIU every bind mount's source as an external mount, and
// CRIU (mount-v2) clones the source without following a link, then fails
// ("Can't remount ... with MS_PRIVATE: Invalid argument"). Podman's --init
// binds /usr/libexec/podman/catatonit, a link on Debian, so every container
// run with --init failed to restore. A config.json without such a source is
// left as it is, and so is a bundle without one (crun says what is wrong);
// the rest of the file is kept as written.
func ResolveBindSources(bundle string) error {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // crun says what is wrong with the bundle
	}
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	var mounts []map[string]json.RawMessage
	if raw, ok := spec["mounts"]; !ok || json.Unmarshal(raw, &mounts) != nil {
		return nil
	}
	changed := false
	for _, m := range mounts {
		var source string
		var options []string
		if json.Unmarshal(m["source"], &source) != nil || !filepath.IsAbs(source) {
			continue
		}
		json.Unmarshal(m["options"], &options)
		if !slices.Contains(options, "bind") && !slices.Contains(options, "rbind") {
			continue
		}
		if st, err := os.Lstat(source); err != nil || st.Mode()&os.ModeSymlink == 0 {
			continue
		}
		real, err := filepath.EvalSymlinks(source)
		if err != nil {
			return fmt.Errorf("bind mount source %s: %w", source, err)
		}
		m["source"], _ = json.Marshal(real)
		changed = true
	}
	if !changed {
		return nil
	}
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
