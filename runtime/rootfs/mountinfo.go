package rootfs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	MountPoint string
	FSType     string
	Source     string
	SuperOpts  string
}

// unescapeMountinfo undoes the octal escapes the kernel applies to spaces,
// tabs, newlines and backslashes in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func parseMountinfoLine(line string) (mountEntry, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return mountEntry{}, false
	}
	fields := strings.Fields(pre)
	tail := strings.Fields(post)
	if len(fields) < 5 || len(tail) < 3 {
		return mountEntry{}, false
	}
	return mountEntry{
		MountPoint: unescapeMountinfo(fields[4]),
		FSType:     tail[0],
		Source:     unescapeMountinfo(tail[1]),
		SuperOpts:  tail[2],
	}, true
}

// mountAt returns the topmost mount whose mount point is exactly path, or
// false when path is not a mount point.
func mountAt(path string) (mountEntry, bool, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return mountEntry{}, false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, false, err
	}
	defer f.Close()
	var found mountEntry
	ok := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m, valid := parseMountinfoLine(sc.Text())
		if valid && m.MountPoint == resolved {
			// Later lines are mounted on top of earlier ones.
			found, ok = m, true
		}
	}
	return found, ok, sc.Err()
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
