package crun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// MakeNestedMountpoints creates, for each bind mount of the bundle's
// config.json that lies inside another bind mount (Podman's secret
// /run/secrets/NAME inside /run/secrets), its mountpoint in the outer
// mount's source directory, where it is missing. crun makes it when it
// creates a container, and it is in the source container's directory; a
// restored container's directory is new, and CRIU fails on the missing
// mountpoint ("Can't stat mountpoint .../NAME"). The mountpoint is made
// beneath the outer source only, following no symbolic link, as an empty
// directory or file after the inner mount's source.
func MakeNestedMountpoints(bundle string) error {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // crun says what is wrong with the bundle
	}
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("reading %s/config.json: %w", bundle, err)
	}
	for _, m := range spec.Mounts {
		if !bindMount(m) {
			continue
		}
		// The mount m lies in: the one whose destination is its nearest
		// ancestor, wherever it is listed (Podman lists its own mounts,
		// /run/secrets among them, after the user's at a restore).
		var outer *specs.Mount
		for i, o := range spec.Mounts {
			if isBelow(m.Destination, o.Destination) && (outer == nil || isBelow(o.Destination, outer.Destination)) {
				outer = &spec.Mounts[i]
			}
		}
		if outer == nil || !bindMount(*outer) || !filepath.IsAbs(outer.Source) {
			continue
		}
		st, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("bind mount source %s: %w", m.Source, err)
		}
		rel := strings.TrimPrefix(filepath.Clean(m.Destination), strings.TrimSuffix(filepath.Clean(outer.Destination), "/")+"/")
		if err := makeMountpoint(outer.Source, rel, st.IsDir()); err != nil {
			return fmt.Errorf("making the mountpoint of %s in %s: %w", m.Destination, outer.Source, err)
		}
	}
	return nil
}

// isBelow tells whether path dest lies strictly inside directory dir.
func isBelow(dest, dir string) bool {
	dest, dir = filepath.Clean(dest), filepath.Clean(dir)
	return dest != dir && strings.HasPrefix(dest, strings.TrimSuffix(dir, "/")+"/")
}

func bindMount(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// makeMountpoint makes rel beneath root, missing directories included, as
// a directory or an empty file; what is there already is left as it is.
func makeMountpoint(root, rel string, dir bool) error {
	beneath := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	fd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC})
	if err != nil {
		return err
	}
	parts := strings.Split(rel, "/")
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			unix.Close(fd)
			return fmt.Errorf("%q is not a plain path", rel)
		}
		if i == len(parts)-1 && !dir {
			f, err := unix.Openat2(fd, p, &unix.OpenHow{Flags: unix.O_CREAT | unix.O_WRONLY | unix.O_CLOEXEC | unix.O_NONBLOCK, Mode: 0o644, Resolve: beneath.Resolve})
			unix.Close(fd)
			if errors.Is(err, unix.EISDIR) {
				return nil // a directory there: CRIU says if it minds
			}
			if err != nil {
				return err
			}
			return unix.Close(f)
		}
		if err := unix.Mkdirat(fd, p, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return err
		}
		next, err := unix.Openat2(fd, p, beneath)
		unix.Close(fd)
		if err != nil {
			return err
		}
		fd = next
	}
	return unix.Close(fd)
}
