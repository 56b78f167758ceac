package hostagent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/volumes"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/podmanfork"
)

// planVolumes applies the policy to the source's mounts: the volumes to
// copy at the fork instant, and what every sibling gets of each mount. A
// mode given for something that is not one of the source's named volumes
// is refused, saying what the source has.
func planVolumes(src *define.InspectContainerData, modes podmanfork.VolumeModes) ([]forkopts.Volume, []podmanfork.VolumeUse, error) {
	def := modes.Default
	if def == "" {
		def = podmanfork.VolumeCopy
	}
	var copies []forkopts.Volume
	var uses []podmanfork.VolumeUse
	var names []string
	named := map[string]bool{}
	for _, m := range src.Mounts {
		switch m.Type {
		case "volume":
			named[m.Name] = true
			names = append(names, m.Name)
			mode, ok := modes.ByName[m.Name]
			if !ok {
				mode = def
			}
			if mode == podmanfork.VolumeCopy {
				if err := copyable(m); err != nil {
					return nil, nil, err
				}
				copies = append(copies, forkopts.Volume{Name: m.Name, Source: m.Source, Destination: m.Destination})
			}
			uses = append(uses, podmanfork.VolumeUse{Name: m.Name, Source: m.Source, Destination: m.Destination, Mode: mode})
		case "bind":
			uses = append(uses, podmanfork.VolumeUse{Source: m.Source, Destination: m.Destination, Mode: podmanfork.VolumeBind})
		}
	}
	for name, mode := range modes.ByName {
		if named[name] {
			continue
		}
		if i := slices.IndexFunc(uses, func(u podmanfork.VolumeUse) bool {
			return u.Mode == podmanfork.VolumeBind && (u.Destination == name || u.Source == name)
		}); i >= 0 {
			if mode == podmanfork.VolumeCopy {
				return nil, nil, fmt.Errorf("--volume-mode %s=copy: %s is host directory %s mounted by path, which is always shared with the sibling; only named volumes are copied", name, uses[i].Destination, uses[i].Source)
			}
			continue
		}
		have := "none"
		if len(names) > 0 {
			have = strings.Join(names, ", ")
		}
		return nil, nil, fmt.Errorf("--volume-mode %s=%s: %s has no volume named %s (its named volumes: %s)", name, mode, src.Name, name, have)
	}
	return copies, uses, nil
}

// copyable refuses a volume whose copy could not be a volume of the
// sibling's own: one of another driver than local (its data may not be a
// directory here), or one mounted with a subpath (the copy would hold only
// that part).
func copyable(m define.InspectMount) error {
	switch {
	case m.Driver != "" && m.Driver != "local":
		return fmt.Errorf("volume %s uses driver %s: only local volumes are copied; share it with --volume-mode %s=share", m.Name, m.Driver, m.Name)
	case m.SubPath != "":
		return fmt.Errorf("volume %s is mounted with subpath %s: only whole volumes are copied; share it with --volume-mode %s=share", m.Name, m.SubPath, m.Name)
	case filepath.Base(m.Source) != "_data" || filepath.Base(filepath.Dir(m.Source)) != m.Name:
		return fmt.Errorf("volume %s is at %s, not where Podman keeps local volumes: share it with --volume-mode %s=share", m.Name, m.Source, m.Name)
	}
	return nil
}

// siblingVolumes names the sibling's own copies of the copied volumes, and
// refuses a name already taken: Podman would mount that volume instead,
// and tclone fills only an empty one.
func siblingVolumes(ctx context.Context, uses []podmanfork.VolumeUse, sibling string) ([]podmanfork.VolumeUse, siblingEdit, error) {
	out := slices.Clone(uses)
	edit := siblingEdit{Volumes: map[string]string{}, VolumePaths: map[string]string{}}
	for i, u := range out {
		if u.Mode != podmanfork.VolumeCopy {
			continue
		}
		name := u.Name + "-" + sibling
		exists, err := volumes.Exists(ctx, name, nil)
		if err != nil {
			return nil, siblingEdit{}, fmt.Errorf("checking for volume %s: %w", name, err)
		}
		if exists {
			return nil, siblingEdit{}, fmt.Errorf("the copy of volume %s for this sibling would be %s, which exists already: remove it (podman volume rm %s), or name the sibling differently", u.Name, name, name)
		}
		out[i].Copy = name
		edit.Volumes[u.Name] = name
		// Beside the source's: copyable checked Podman's layout.
		edit.VolumePaths[u.Source] = filepath.Join(filepath.Dir(filepath.Dir(u.Source)), name, "_data")
	}
	return out, edit, nil
}
