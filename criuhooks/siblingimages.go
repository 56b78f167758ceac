package criuhooks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/utsns"
)

// SiblingImages makes the image directory one sibling restores from: hard
// links to the plan's images, which stay read-only and shared by every
// sibling, plus private copies of the few images this sibling changes.
//
// Hard links, not symlinks: CRIU's restored tasks read their pages through
// the directory from inside the sibling's mount namespace, where an absolute
// symlink into the host's plan store does not resolve. So dir must be on the
// plan store's tmpfs.
//
// A twin plan's daemon publishes drained images while siblings start
// (lazypages' drain: the new pages image first, then the pagemap naming it,
// put in place of the old one by rename). A pass over the directory may so
// link a pagemap that names a pages image its listing did not have: a
// second pass links what appeared meanwhile, which is then there. The
// daemon's temporary names are never linked.
func SiblingImages(planImages, dir, hostname string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for pass := 0; pass < 2; pass++ {
		entries, err := os.ReadDir(planImages)
		if err != nil {
			return fmt.Errorf("reading plan images: %w", err)
		}
		seen := map[string]bool{}
		for _, e := range entries {
			name := e.Name()
			if strings.HasSuffix(name, ".tmp") || strings.HasSuffix(name, ".drained") || seen[name] {
				// A name listed twice: the drain renamed and linked in the
				// directory while it was read (a tmpfs listing may then
				// give an entry again).
				continue
			}
			seen[name] = true
			src := filepath.Join(planImages, name)
			dst := filepath.Join(dir, name)
			if pass > 0 {
				if _, err := os.Lstat(dst); err == nil {
					continue
				}
			}
			if hostname != "" && strings.HasPrefix(name, "utsns-") && strings.HasSuffix(name, ".img") {
				if err := rewriteHostname(src, dst, hostname); err != nil {
					return fmt.Errorf("setting the sibling's hostname in %s: %w", name, err)
				}
				continue
			}
			if err := linkImage(src, dst); err != nil {
				return fmt.Errorf("linking plan image %s: %w", name, err)
			}
		}
	}
	return nil
}

// linkImage hard-links src at dst while the drain may be putting a new file
// in place of src. link() looks the name up and then links the inode it
// found; when a rename takes that inode's last name in between, the kernel
// refuses with ENOENT although the name is there, now on the new file. So
// ENOENT is tried again while the name exists; a name that is gone was
// never there for this pass, as if the listing had not had it.
func linkImage(src, dst string) error {
	const tries = 100
	var err error
	for i := 0; i < tries; i++ {
		if err = os.Link(src, dst); err == nil || !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if _, serr := os.Lstat(src); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
	}
	return err
}

// rewriteHostname copies a UTS namespace image with a new node name, so the
// sibling's processes see their own hostname from their first instruction.
func rewriteHostname(src, dst, hostname string) error {
	img, err := decodeImage(src, &utsns.UtsnsEntry{})
	if err != nil {
		return err
	}
	for _, e := range img.Entries {
		if u, ok := e.Message.(*utsns.UtsnsEntry); ok {
			u.Nodename = &hostname
		}
	}
	return encodeImage(img, dst, os.O_EXCL)
}
