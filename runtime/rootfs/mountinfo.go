package rootfs

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// mountAt returns the topmost mount whose mount point is exactly path, or
// false when path is not a mount point.
func mountAt(path string) (*mountinfo.Info, bool, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, false, err
	}
	m, err := topmost(mountinfo.GetMounts(at(resolved)))
	return m, m != nil, err
}

// at keeps the mounts whose mount point is path (mountinfo unescapes the
// kernel's octal escapes of spaces, tabs, newlines and backslashes).
func at(path string) mountinfo.FilterFunc {
	return func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != path, false }
}

// topmost is the last of mounts, in mountinfo's order: later lines are
// mounted on top of earlier ones.
func topmost(mounts []*mountinfo.Info, err error) (*mountinfo.Info, error) {
	if err != nil || len(mounts) == 0 {
		return nil, err
	}
	return mounts[len(mounts)-1], nil
}

// overlayLayers is an overlay mount's layers.
type overlayLayers struct {
	Lower []string // top first, as the kernel orders them
	Upper string
}

// splitOverlayOpts splits overlay super options on commas that the kernel did
// not escape.
func splitOverlayOpts(opts string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(opts); i++ {
		c := opts[i]
		if c == '\\' && i+1 < len(opts) {
			cur.WriteByte(opts[i+1])
			i++
			continue
		}
		if c == ',' {
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(out, cur.String())
}

func parseOverlayOpts(opts string) (overlayLayers, error) {
	var l overlayLayers
	for _, o := range splitOverlayOpts(opts) {
		k, v, _ := strings.Cut(o, "=")
		switch k {
		case "lowerdir":
			// Layers after "::" are data-only: they hold file contents
			// for metacopy entries, not names, and are not part of the
			// tree.
			names, _, _ := strings.Cut(v, "::")
			for _, d := range strings.Split(names, ":") {
				if d != "" {
					l.Lower = append(l.Lower, d)
				}
			}
		case "lowerdir+":
			l.Lower = append(l.Lower, v)
		case "datadir+":
			// Data-only, as above.
		case "upperdir":
			l.Upper = v
		}
	}
	if l.Upper == "" {
		return l, fmt.Errorf("overlay mount has no upperdir (read-only overlay): nothing of the container's own writes to capture")
	}
	if len(l.Lower) == 0 {
		return l, fmt.Errorf("overlay mount options %q name no lowerdir", opts)
	}
	return l, nil
}
