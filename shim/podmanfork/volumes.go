package podmanfork

import (
	"fmt"
	"sort"
	"strings"
)

// VolumeMode says what a sibling gets of one of the source's named volumes.
type VolumeMode string

const (
	// VolumeCopy gives each sibling a new volume of its own,
	// <volume>-<sibling>, holding the volume's contents at the fork
	// instant; `podman rm -v SIBLING` removes it.
	VolumeCopy VolumeMode = "copy"
	// VolumeShare mounts the source's volume itself in the sibling: both
	// write into the same files.
	VolumeShare VolumeMode = "share"
	// VolumeBind is a host directory mounted by path: always shared.
	VolumeBind VolumeMode = "bind"
)

// VolumeModes is the volume policy of a fork: Default for every named
// volume ("" is copy), and ByName for single volumes.
type VolumeModes struct {
	Default VolumeMode
	ByName  map[string]VolumeMode
}

// ParseVolumeModes reads --volume-mode values: copy or share for every named
// volume, NAME=copy or NAME=share for one.
func ParseVolumeModes(values []string) (VolumeModes, error) {
	var m VolumeModes
	for _, v := range values {
		name, mode, one := strings.Cut(v, "=")
		if !one {
			name, mode = "", v
		}
		switch VolumeMode(mode) {
		case VolumeCopy, VolumeShare:
		default:
			return VolumeModes{}, fmt.Errorf("volume mode %q: give copy, share, NAME=copy or NAME=share", v)
		}
		switch {
		case !one && m.Default != "" && m.Default != VolumeMode(mode):
			return VolumeModes{}, fmt.Errorf("volume modes %s and %s both given for every volume: give one, and NAME=MODE for the exceptions", m.Default, mode)
		case !one:
			m.Default = VolumeMode(mode)
		case name == "":
			return VolumeModes{}, fmt.Errorf("volume mode %q names no volume", v)
		default:
			if m.ByName == nil {
				m.ByName = map[string]VolumeMode{}
			}
			if old, ok := m.ByName[name]; ok && old != VolumeMode(mode) {
				return VolumeModes{}, fmt.Errorf("volume %s given two modes, %s and %s", name, old, mode)
			}
			m.ByName[name] = VolumeMode(mode)
		}
	}
	return m, nil
}

// VolumeUse is what a sibling got of one of the source's mounts, as
// --print-stats reports it.
type VolumeUse struct {
	// Name is the source's volume; empty for a host directory.
	Name        string     `json:"name,omitempty"`
	Source      string     `json:"source"`
	Destination string     `json:"destination"`
	Mode        VolumeMode `json:"mode"`
	// Copy is the sibling's own volume (mode copy).
	Copy string `json:"copy,omitempty"`
}

// Values is the modes as --volume-mode values, the default first.
func (m VolumeModes) Values() []string {
	var out []string
	if m.Default != "" {
		out = append(out, string(m.Default))
	}
	names := make([]string, 0, len(m.ByName))
	for n := range m.ByName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, n+"="+string(m.ByName[n]))
	}
	return out
}

// FlagValues is the modes as --volume-mode values.
func (m VolumeModes) FlagValues() []string { return m.Values() }

// SetFlagValues reads --volume-mode values.
func (m *VolumeModes) SetFlagValues(values []string) error {
	v, err := ParseVolumeModes(values)
	if err == nil {
		*m = v
	}
	return err
}
