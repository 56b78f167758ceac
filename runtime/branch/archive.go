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
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// An exported branch is one tar stream compressed with zstd:
//
//	tclone-branch/branch.json       the manifest, first
//	tclone-branch/chunks/<sha256>   every chunk it uses, as stored
//	tclone-branch/trees/<tree>.tar  each tree, in GNU tar's format (xattrs,
//	                                devices and hard links kept)
//	tclone-branch/files/<name>      its other files (the checkpoint archive)
const (
	archiveRoot     = "tclone-branch/"
	archiveManifest = archiveRoot + "branch.json"
	archiveChunks   = archiveRoot + "chunks/"
	archiveTrees    = archiveRoot + "trees/"
	archiveFiles    = archiveRoot + "files/"
)

// tarTree and untarTree run GNU tar, which keeps every xattr (overlay's
// trusted.* ones included, as root), device nodes and hard links.
var tarFlags = []string{"--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"}

// ExportTo writes branch ref to out, as Export does to a file.
func (s Store) ExportTo(ref string, out io.Writer) (*Branch, error) {
	release, err := s.use()
	if err != nil {
		return nil, err
	}
	defer release()
	b, err := s.Get(ref)
	if err != nil {
		return nil, err
	}
	return b, s.export(b, out)
}

// Export writes branch ref to path, atomically: a failure leaves no file.
func (s Store) Export(ref, dest string) (*Branch, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("exporting branch %s: %w", ref, err)
	}
	b, err := s.ExportTo(ref, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("exporting branch %s to %s: %w", ref, dest, err)
	}
	return b, nil
}

func (s Store) export(b *Branch, out io.Writer) error {
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	manifest, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if err := writeEntry(tw, archiveManifest, manifest); err != nil {
		return err
	}
	done := map[string]bool{}
	for _, f := range b.Files {
		for _, c := range f.Chunks {
			if done[c.Hash] {
				continue
			}
			done[c.Hash] = true
			if err := addFile(tw, s.chunks().path(c.Hash), archiveChunks+c.Hash); err != nil {
				return fmt.Errorf("%w: chunk %s of %s: %v", ErrCorrupt, c.Hash, f.Path, err)
			}
		}
	}
	dir := s.dirOf(b.ID)
	for _, t := range b.Trees {
		if err := addTree(tw, filepath.Join(dir, t), archiveTrees+t+".tar"); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "branch.json" {
			continue
		}
		if err := addFile(tw, filepath.Join(dir, e.Name()), archiveFiles+e.Name()); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func writeEntry(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func addFile(tw *tar.Writer, src, name string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: st.Size(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// addTree adds directory dir as one GNU tar file; the entry's size must
// be known first, so it is made beside the archive's temporary file.
func addTree(tw *tar.Writer, dir, name string) error {
	tmp, err := os.CreateTemp("", "tclone-tree-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	cmd := exec.Command("tar", append(append([]string{"--create", "--file=-"}, tarFlags...), "-C", dir, ".")...)
	cmd.Stdout = tmp
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("packing %s: %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return addFile(tw, tmp.Name(), name)
}

// ErrNotBranchArchive reports a file that is no exported branch.
var ErrNotBranchArchive = errors.New("not a branch exported by podman container branch export")

// Import reads a branch exported to src into the store, as name (its own
// name when empty). check sees the branch's manifest before anything is
// written, and may refuse it (an image this host lacks). Every chunk is
// checked against its hash. A failure leaves no branch.
func (s Store) Import(src, name string, check func(*Branch) error) (*Branch, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return s.ImportFrom(f, src, name, check)
}

// ImportFrom is Import of the archive read from in, which src names in
// errors.
func (s Store) ImportFrom(in io.Reader, src, name string, check func(*Branch) error) (*Branch, error) {
	zr, err := zstd.NewReader(in)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, ErrNotBranchArchive)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	h, err := tr.Next()
	if err != nil || h.Name != archiveManifest {
		return nil, fmt.Errorf("%s: %w (it does not begin with %s)", src, ErrNotBranchArchive, archiveManifest)
	}
	var m Branch
	if err := json.NewDecoder(io.LimitReader(tr, 64<<20)).Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w: its manifest does not decode: %v", src, ErrNotBranchArchive, err)
	}
	if m.Version != FormatVersion {
		return nil, fmt.Errorf("%s holds a branch of format version %d; this tclone reads version %d", src, m.Version, FormatVersion)
	}
	if name == "" {
		name = m.Name
	}
	if err := check(&m); err != nil {
		return nil, err
	}
	w, err := s.Begin(name, m.Source)
	if err != nil {
		return nil, err
	}
	if err := w.readArchive(tr, &m); err != nil {
		w.Abort()
		return nil, fmt.Errorf("importing %s: %w", src, err)
	}
	b, err := w.Commit(func(b *Branch) {
		id := b.ID
		added := b.Size.ChunksAdded
		*b = m
		b.ID, b.Name, b.Size.ChunksAdded = id, name, added
	})
	return b, err
}

func (w *Writer) readArchive(tr *tar.Reader, in *Branch) error {
	trees := map[string]bool{}
	for _, t := range in.Trees {
		trees[t] = true
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		switch {
		case strings.HasPrefix(name, archiveChunks):
			hash := strings.TrimPrefix(name, archiveChunks)
			if !validHash(hash) {
				return fmt.Errorf("%w: entry %s", ErrNotBranchArchive, h.Name)
			}
			packed, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			added, err := w.store.chunks().putPacked(hash, packed)
			if err != nil {
				return err
			}
			w.b.Size.ChunksAdded += added
		case strings.HasPrefix(name, archiveTrees) && strings.HasSuffix(name, ".tar"):
			rel := strings.TrimSuffix(strings.TrimPrefix(name, archiveTrees), ".tar")
			if !trees[rel] {
				return fmt.Errorf("%w: tree %s is not in its manifest", ErrNotBranchArchive, rel)
			}
			if err := w.untar(tr, rel); err != nil {
				return err
			}
		case strings.HasPrefix(name, archiveFiles):
			base := strings.TrimPrefix(name, archiveFiles)
			if base != filepath.Base(base) || base == "branch.json" || base == "lock" || base == partialFile {
				return fmt.Errorf("%w: entry %s", ErrNotBranchArchive, h.Name)
			}
			out, err := os.OpenFile(filepath.Join(w.dir, base), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: unknown entry %s", ErrNotBranchArchive, h.Name)
		}
	}
	// Every chunk the manifest lists must now be in the store.
	for _, f := range in.Files {
		for _, c := range f.Chunks {
			if _, err := os.Stat(w.store.chunks().path(c.Hash)); err != nil {
				return fmt.Errorf("%w: the archive lacks chunk %s of %s", ErrCorrupt, c.Hash, f.Path)
			}
		}
	}
	for t := range trees {
		if _, err := os.Stat(filepath.Join(w.dir, t)); err != nil {
			return fmt.Errorf("%w: the archive lacks tree %s", ErrCorrupt, t)
		}
	}
	return nil
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

func (w *Writer) untar(r io.Reader, rel string) error {
	dst := filepath.Join(w.dir, rel)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	cmd := exec.Command("tar", append(append([]string{"--extract", "--file=-", "--same-permissions", "--same-owner"}, tarFlags...), "-C", dst)...)
	cmd.Stdin = r
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("unpacking tree %s: %v: %s", rel, err, strings.TrimSpace(stderr.String()))
	}
	w.b.Trees = append(w.b.Trees, rel)
	w.b.Size.Trees += treeSize(dst)
	return nil
}

// putPacked stores a chunk as it was stored elsewhere, after checking that
// it holds what its hash says.
func (c chunkStore) putPacked(hash string, packed []byte) (int64, error) {
	data, err := zstdDecoder().DecodeAll(packed, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: chunk %s does not decompress: %v", ErrCorrupt, hash, err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != hash {
		return 0, fmt.Errorf("%w: chunk %s holds data with hash %s", ErrCorrupt, hash, got)
	}
	if _, err := os.Stat(c.path(hash)); err == nil {
		return 0, nil
	}
	return c.write(hash, packed)
}
