package branch

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/internal/copyfile"
)

// An unpacked export is an exported branch laid out as files in a
// directory, its chunks left out: the plan files they make up are kept
// whole wherever the caller puts them (a checkpoint image keeps the CRIU
// images where Podman's restore looks for them), and cut again on import.
// The cut is content-defined, so it finds the manifest's chunks, and the
// signature covers them as it covers an archive's.
//
//	<dir>/branch.json, index.json, signature.json
//	<dir>/trees/<tree>.tar, <dir>/files/<name>   as in an archive
const (
	unpackedManifest  = "branch.json"
	unpackedIndex     = "index.json"
	unpackedSignature = "signature.json"
)

// ExportUnpacked writes branch ref, signed with key, into dir (which must
// exist and be empty), but for its plan files: the caller writes those
// (Reader.WritePlan), for ImportUnpacked to find.
func (s Store) ExportUnpacked(ref, dir string, key *signing.Key) (*Branch, error) {
	b, release, err := s.exportable(ref)
	if err != nil {
		return nil, err
	}
	defer release()
	scratch, err := os.MkdirTemp(s.Dir, ".export-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	head, err := s.signedHead(b, scratch, key)
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{unpackedManifest: head.manifest, unpackedIndex: head.index, unpackedSignature: head.signature} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	for _, e := range head.entries {
		dst := filepath.Join(dir, filepath.FromSlash(e.Name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, err
		}
		if err := copyfile.Copy(e.path, dst, newFile); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// ImportUnpacked imports the branch unpacked in dir, whose plan file of
// path P (as the manifest names it) is at planFile(P), with the checks and
// trust of an archive's import. src names it in errors.
func (s Store) ImportUnpacked(dir string, planFile func(string) string, src string, opts ImportOptions) (*Branch, error) {
	manifest, err := readBounded(filepath.Join(dir, unpackedManifest), maxManifestBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", src, ErrNotBranchArchive, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeUnpackedArchive(pw, dir, manifest, planFile)) }()
	b, err := s.importTar(tar.NewReader(pr), src, opts)
	// The writer stops at the first write after this.
	pr.CloseWithError(errors.New("import ended"))
	return b, err
}

// writeUnpackedArchive writes the archive an unpacked export stands for:
// its head, a chunk entry for every chunk of the plan files as found now,
// then the trees and files the index lists.
func writeUnpackedArchive(out io.Writer, dir string, manifest []byte, planFile func(string) string) error {
	tw := tar.NewWriter(out)
	if err := writeEntry(tw, archiveManifest, manifest); err != nil {
		return err
	}
	idxData, err := os.ReadFile(filepath.Join(dir, unpackedIndex))
	if err != nil {
		// The import refuses an archive without an index as unsigned.
		return tw.Close()
	}
	if err := writeEntry(tw, archiveIndex, idxData); err != nil {
		return err
	}
	if sig, err := os.ReadFile(filepath.Join(dir, unpackedSignature)); err == nil {
		if err := writeEntry(tw, archiveSignature, sig); err != nil {
			return err
		}
	}
	// The import checks the head while this goes on: what is read here is
	// checked here too.
	var b Branch
	if err := json.Unmarshal(manifest, &b); err != nil {
		return err
	}
	if err := b.Check(); err != nil {
		return err
	}
	done := map[string]bool{}
	for _, f := range b.Files {
		if !filepath.IsLocal(f.Path) {
			return invalid("file %.200q", f.Path)
		}
		if err := writeFileChunks(tw, planFile(f.Path), done); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, f.Path, err)
		}
	}
	var idx index
	if err := json.Unmarshal(idxData, &idx); err != nil {
		return err
	}
	for _, e := range idx.Entries {
		if !filepath.IsLocal(e.Name) {
			return invalid("entry %.200q", e.Name)
		}
		if err := addFile(tw, filepath.Join(dir, filepath.FromSlash(e.Name)), archiveRoot+e.Name); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, e.Name, err)
		}
	}
	return tw.Close()
}

// writeFileChunks cuts the file at path as a branch's writer does and
// writes each chunk not done yet, compressed as a store keeps it.
func writeFileChunks(tw *tar.Writer, path string, done map[string]bool) error {
	data, err := mapFile(path)
	if err != nil {
		return err
	}
	defer unmap(data)
	off := 0
	for _, n := range cuts(data) {
		piece := data[off : off+n]
		off += n
		sum := sha256.Sum256(piece)
		hash := hex.EncodeToString(sum[:])
		if done[hash] {
			continue
		}
		done[hash] = true
		if err := writeEntry(tw, archiveChunks+hash, zstdEncoder().EncodeAll(piece, nil)); err != nil {
			return err
		}
	}
	return nil
}

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s has more than %d bytes", path, limit)
	}
	return data, nil
}
