package crun

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// makeNestedMountpoints creates, for each bind mount that lies inside
// another bind mount (Podman's secret /run/secrets/NAME inside
// /run/secrets), its mountpoint in the outer mount's source directory,
// where it is missing. crun makes it when it creates a container, and it is
// in the source container's directory; a restored container's directory is
// new, and CRIU fails on the missing mountpoint ("Can't stat mountpoint
// .../NAME"). A missing mountpoint is made beneath the outer source only,
// following no symbolic link, as an empty directory or file after the inner
// mount's source; what is there is left as it is. Every mount is tried; the
// errors are returned together.
func makeNestedMountpoints(mounts []specs.Mount) error {
	var errs []error
	for _, m := range mounts {
		if !bindMount(m) {
			continue
		}
		// The mount m lies in: the one whose destination is its nearest
		// ancestor, wherever it is listed (Podman lists its own mounts,
		// /run/secrets among them, after the user's at a restore).
		var outer *specs.Mount
		for i, o := range mounts {
			if isBelow(m.Destination, o.Destination) && (outer == nil || isBelow(o.Destination, outer.Destination)) {
				outer = &mounts[i]
			}
		}
		if outer == nil || !bindMount(*outer) || !filepath.IsAbs(outer.Source) {
			continue
		}
		rel := strings.TrimPrefix(filepath.Clean(m.Destination), strings.TrimSuffix(filepath.Clean(outer.Destination), "/")+"/")
		// Whatever is there already, even behind a link, is left for CRIU
		// to judge: it is never opened, nor made again.
		if _, err := os.Lstat(filepath.Join(outer.Source, rel)); err == nil {
			continue
		}
		st, err := os.Stat(m.Source)
		if err != nil {
			errs = append(errs, fmt.Errorf("bind mount source %s: %w", m.Source, err))
			continue
		}
		if err := makeMountpoint(outer.Source, rel, st.IsDir()); err != nil {
			errs = append(errs, fmt.Errorf("making the mountpoint of %s in %s: %w", m.Destination, outer.Source, err))
		}
	}
	return errors.Join(errs...)
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
// a directory or an empty file. It follows no symbolic link (one on the way
// is an error: what it leads to is not root's), and opens nothing that was
// there: a file is made with O_EXCL, and one made meanwhile is left.
func makeMountpoint(root, rel string, dir bool) error {
	beneath := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS)
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
			f, err := unix.Openat2(fd, p, &unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: 0o644, Resolve: beneath})
			unix.Close(fd)
			if errors.Is(err, unix.EEXIST) {
				return nil
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
		next, err := unix.Openat2(fd, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) {
			return fmt.Errorf("%s is a symbolic link, which is not followed: make the mountpoint there by hand, or remove the link", filepath.Join(append([]string{root}, parts[:i+1]...)...))
		}
		if err != nil {
			return err
		}
		fd = next
	}
	return unix.Close(fd)
}
