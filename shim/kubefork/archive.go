package kubefork

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tclone/tclone/runtime/plan"
)

// rootfsDiff is the entry of a CRI checkpoint archive containerd unpacks
// over a restored container's root before it starts it: the container's
// changed files as containerd read them after the checkpoint, when the
// source ran on. A fork plan holds the root as it was at the fork instant,
// which tclone's restore puts in place itself; the later diff must not.
const rootfsDiff = "rootfs-diff.tar"

// forkArchive copies the CRI checkpoint archive src to dst without its root
// filesystem diff, and returns the fork plan it refers to. It refuses a
// portable checkpoint (which refers to no plan, and whose restore needs
// that diff).
func forkArchive(src, dst string) (*plan.Reference, error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	ref, err := copyWithoutDiff(tar.NewReader(in), out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ref, fmt.Errorf("the checkpoint archive %s: %w", src, err)
	}
	if ref == nil {
		return nil, fmt.Errorf("the checkpoint archive refers to no fork plan: the container's runtime did not take the fork request (is its pod's runtime class tclone?)")
	}
	return ref, nil
}

// copyWithoutDiff copies every entry of tr but the root filesystem diff
// into w, reading the plan reference on the way.
func copyWithoutDiff(tr *tar.Reader, w io.Writer) (*plan.Reference, error) {
	tw := tar.NewWriter(w)
	var ref *plan.Reference
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return ref, err
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name == rootfsDiff {
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return ref, err
		}
		var body io.Reader = tr
		if name == "checkpoint/"+plan.ReferenceFile {
			var buf bytes.Buffer
			if ref, err = readReference(io.TeeReader(io.LimitReader(tr, 1<<16), &buf)); err != nil {
				return nil, err
			}
			body = io.MultiReader(&buf, tr)
		}
		if _, err := io.Copy(tw, body); err != nil {
			return ref, err
		}
	}
	return ref, tw.Close()
}
