package hostagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/branch"
)

// imageRules are the tree rules of an imported branch: its root filesystem
// capture may hold a device node, a set-ID file or a file capability only
// where its image (here, on this host) has the same at the same path, as a
// container's copy-up of an image file keeps them. Volume copies may hold
// none.
func imageRules(ctx context.Context, b *branch.Branch) (branch.TreeRules, error) {
	if b.Plan.Rootfs == nil {
		return branch.TreeRules{}, nil
	}
	layers, err := imageLayers(ctx, b.Source.ImageID)
	if err != nil {
		// An image of another storage driver has no layers to compare
		// with: nothing special is allowed.
		return branch.TreeRules{}, nil
	}
	return branch.TreeRules{Allow: func(tree string, s branch.Special) bool {
		return tree == branch.RootfsTree && imageHas(layers, s)
	}}, nil
}

// imageHas reports whether the topmost of layers (top first) that holds
// s.Path holds the same special file. Paths are resolved beneath each
// layer, without following symlinks.
func imageHas(layers []string, s branch.Special) bool {
	for _, layer := range layers {
		st, fd, err := lstatBeneath(layer, s.Path)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			return false // deleted in this layer
		}
		switch s.Kind {
		case branch.SpecialSetID:
			return st.Mode == s.Mode && int(st.Uid) == s.Uid && (s.Mode&unix.S_ISGID == 0 || int(st.Gid) == s.Gid)
		case branch.SpecialDevice:
			return st.Mode&unix.S_IFMT == s.Mode&unix.S_IFMT && st.Rdev == s.Rdev
		case branch.SpecialCapability:
			return st.Mode&unix.S_IFMT == unix.S_IFREG && sameXattr(fd, "security.capability", s.Value)
		}
		return false
	}
	return false
}

func lstatBeneath(root, path string) (unix.Stat_t, int, error) {
	var st unix.Stat_t
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, -1, err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return st, -1, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return st, -1, err
	}
	return st, fd, nil
}

func sameXattr(fd int, name string, want []byte) bool {
	buf := make([]byte, 1024)
	n, err := unix.Getxattr(fmt.Sprintf("/proc/self/fd/%d", fd), name, buf)
	return err == nil && bytes.Equal(buf[:n], want)
}
