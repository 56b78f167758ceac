package hostagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containers/podman/v5/pkg/bindings/images"

	"github.com/tclone/tclone/criuhooks/pagedelta"
	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

// A delta checkpoint image is a checkpoint image written over an earlier one
// of the same container (export --parent-image): the parent image's layer,
// then one layer with what changed. Its union is a checkpoint image as
// Podman reads one:
//
//   - checkpoint/ holds CRIU's images of the new branch, whose pagemaps read
//     every page the parent holds unchanged at the same address from
//     checkpoint/parent/ (CRIU's incremental dump layout, which stock CRIU
//     restores): copies of the parent's pagemaps, and links to the parent's
//     pages images, which the union keeps beside the new ones
//     (criuhooks/pagedelta);
//   - a file of the parent's layer that the branch does not have is
//     hidden by an empty stand-in (a CRIU image with no entries, an empty
//     tar or list), since a layer written by a build cannot delete. A
//     stand-in is a file, not a missing one: where the branch's images
//     name an optional image its dump left out for having nothing to say,
//     CRIU reads no entries from the stand-in, as from a missing one,
//     instead of the parent's; a raw image (a tar) is never left out of a
//     dump that names it;
//   - a file the branch has with the parent's exact bytes is left to the
//     parent's layer.
//
// tclone's own import reads the union, writes each task's full pages image
// back from the delta and its parent, and checks all of it against the
// branch's signed manifest (the original pagemaps are kept in tclone/plan).
//
// The parent must be a full checkpoint image this host exported from a
// branch of the same container, which the host still has: the delta is
// computed from that branch's pages, and the host's record of the image
// (runtime/branch's ImageRecord, made by the full export) says what its
// layer holds. A delta is never a parent: each delta is one layer over a
// full image.

// AnnotationParentImage names, on a delta checkpoint image, the image it
// was written over.
const AnnotationParentImage = "io.tclone.parent-image"

// imageParent is the full checkpoint image a delta is written over.
type imageParent struct {
	name, id string
	reader   *branch.Reader
	record   *branch.ImageRecord
}

func (p *imageParent) close() { p.reader.Close() }

// DeltaStats is what a delta image leaves to its parent.
type DeltaStats struct {
	ParentImage string `json:"parent_image"`
	ParentID    string `json:"parent_id"`
	// Pages are the branch's pages; PagesInParent those the image reads
	// from its parent.
	Pages         int64 `json:"pages"`
	PagesInParent int64 `json:"pages_in_parent"`
	// FilesInParent are the files the parent has with the same bytes.
	FilesInParent int `json:"files_in_parent"`
}

func invalidParent(format string, args ...any) error {
	return podmanfork.WithKind(podmanfork.ErrInvalidOption, fmt.Errorf("--parent-image "+format, args...))
}

// openImageParent checks that image name can be the parent of a delta of
// branch b, and opens what the delta is computed from.
func (a *Agent) openImageParent(ctx context.Context, b *branch.Branch, name string) (*imageParent, error) {
	if ok, err := images.Exists(ctx, name, nil); err != nil {
		return nil, err
	} else if !ok {
		return nil, invalidParent("%s: no such image on this host (a delta is written on top of the parent: pull it first)", name)
	}
	data, err := images.GetImage(ctx, name, nil)
	if err != nil {
		return nil, err
	}
	id, labels := data.ID, data.Labels
	switch {
	case labels[AnnotationParentImage] != "":
		return nil, invalidParent("%s is itself a delta over image %s: name that full image instead (each delta is one layer over a full image)", name, labels[AnnotationParentImage])
	case labels[AnnotationBranch] == "":
		return nil, invalidParent("%s is no checkpoint image written by podman container branch export --image", name)
	case data.RootFS == nil || len(data.RootFS.Layers) != 1:
		return nil, invalidParent("%s has more than one layer: it is no full checkpoint image of tclone's", name)
	}
	r, err := a.Branches().Open(labels[AnnotationBranch])
	if errors.Is(err, branch.ErrNotFound) {
		return nil, invalidParent("%s was exported from branch %s, which this host does not have: a delta is computed from the parent's branch; export a full image instead", name, labels[AnnotationBranch])
	}
	if err != nil {
		return nil, err
	}
	pb := r.Branch()
	if pb.Source.ID != b.Source.ID {
		r.Close()
		return nil, invalidParent("%s holds branch %s of container %s, and branch %s is of container %s: a delta is written over an image of the same container", name, pb.Name, pb.Source.Name, b.Name, b.Source.Name)
	}
	rec, err := a.Branches().ImageRecord(pb, id)
	if err != nil {
		r.Close()
		if errors.Is(err, branch.ErrNoImageRecord) {
			return nil, invalidParent("%s (ID %.12s) is not an image this host exported from branch %s: export branch %s as a full image here first, and name that image", name, id, pb.Name, pb.Name)
		}
		return nil, err
	}
	return &imageParent{name: name, id: id, reader: r, record: rec}, nil
}

// layerDigests is what an image record keeps of a layer directory.
func layerDigests(dir string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if isPagesImage(rel) {
			out[rel] = ""
			return nil
		}
		sum, err := fileSHA256(p)
		out[rel] = sum
		return err
	})
	return out, err
}

// isPagesImage: a pages image of a checkpoint image's CRIU images.
func isPagesImage(rel string) bool {
	dir, name := path.Split(rel)
	return dir == checkpointDir+"/" && pagedelta.IsPagesImage(name)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeDelta turns layer, a full checkpoint image layer whose files are
// digested in files, into a delta over p.
func writeDelta(layer, scratch string, p *imageParent, files map[string]string) (*DeltaStats, error) {
	parentPlan := filepath.Join(scratch, "parent-plan")
	if err := os.Mkdir(parentPlan, 0o700); err != nil {
		return nil, err
	}
	if err := p.reader.WritePlan(parentPlan); err != nil {
		return nil, fmt.Errorf("the parent image's branch: %w", err)
	}
	parentImages := plan.ImagesDir(parentPlan)
	images := filepath.Join(layer, checkpointDir)
	maps, err := pagedelta.Pagemaps(images)
	if err != nil {
		return nil, err
	}
	// The parent's pagemaps are those its image holds, or the delta would
	// point into pages that are not there.
	for rel, sum := range p.record.Files {
		if name, ok := strings.CutPrefix(rel, checkpointDir+"/"); ok && strings.HasPrefix(name, "pagemap-") && !strings.Contains(name, "/") {
			got, err := fileSHA256(filepath.Join(parentImages, name))
			if err != nil || got != sum {
				return nil, fmt.Errorf("image %s does not hold branch %s's %s (%v): export the branch as a full image again", p.name, p.reader.Branch().Name, name, err)
			}
		}
	}
	// tclone's import reads the branch's own pagemaps; CRIU reads the
	// delta's. Pages images no pagemap names (a drained capture's first
	// ones) move there too: under CRIU's numbering, they would hide the
	// parent's of the same name in the union.
	kept := filepath.Join(layer, imagePlanDir, "images")
	for _, name := range maps {
		if err := copyRegular(filepath.Join(images, name), filepath.Join(kept, name)); err != nil {
			return nil, err
		}
	}
	unused, err := pagedelta.Unreferenced(images)
	if err != nil {
		return nil, err
	}
	for _, name := range unused {
		if err := os.Rename(filepath.Join(images, name), filepath.Join(kept, name)); err != nil {
			return nil, err
		}
	}
	st, err := pagedelta.Delta(images, parentImages)
	if err != nil {
		return nil, err
	}
	x := &DeltaStats{ParentImage: p.name, ParentID: p.id, Pages: st.Pages, PagesInParent: st.InParent}
	for rel, sum := range files {
		if sum == "" || p.record.Files[rel] != sum || isDeltaPagemap(rel) {
			continue
		}
		if err := os.Remove(filepath.Join(layer, filepath.FromSlash(rel))); err != nil {
			return nil, err
		}
		x.FilesInParent++
	}
	for rel := range p.record.Files {
		if _, ok := files[rel]; ok || isPagesImage(rel) {
			continue
		}
		if err := writeStandIn(layer, rel, parentImages); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// isDeltaPagemap: a pagemap Delta rewrote.
func isDeltaPagemap(rel string) bool {
	dir, name := path.Split(rel)
	return dir == checkpointDir+"/" && strings.HasPrefix(name, "pagemap-")
}

// CRIU's image magics (criu/include/magic.h): every image but raw ones
// starts with one, then its own.
var criuMagics = [][]byte{{0x19, 0x43, 0x56, 0x54}, {0x40, 0x59, 0x10, 0x55}}

// writeStandIn hides the parent layer's file rel: an image with no entries
// for a CRIU image (its two magics), an empty tar for a tar, an empty list
// for the list of deleted files, else an empty file.
func writeStandIn(layer, rel, parentImages string) error {
	var data []byte
	switch name, inImages := strings.CutPrefix(rel, checkpointDir+"/"); {
	case inImages:
		head := make([]byte, 8)
		f, err := os.Open(filepath.Join(parentImages, filepath.FromSlash(name)))
		if err == nil {
			_, err = io.ReadFull(f, head)
			f.Close()
		}
		if err == nil && (bytes.Equal(head[:4], criuMagics[0]) || bytes.Equal(head[:4], criuMagics[1])) {
			data = head
		}
	case strings.HasSuffix(rel, ".tar"):
		data = make([]byte, 1024)
	case rel == deletedFiles:
		data = []byte("[]")
	}
	dst := filepath.Join(layer, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o600)
}

// assembleDelta writes, in the union layer of a delta checkpoint image,
// the full pages image of each pagemap tclone/plan keeps the branch's own
// copy of (imagePlanFile prefers it there).
func assembleDelta(layer string) error {
	images := filepath.Join(layer, checkpointDir)
	if _, err := os.Lstat(filepath.Join(images, pagedelta.ParentDir)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return pagedelta.AssembleAll(images, filepath.Join(layer, imagePlanDir, "images"))
}
