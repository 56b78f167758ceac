package branch

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/internal/copyfile"
)

// An exported branch is one tar stream compressed with zstd:
//
//	tclone-branch/branch.json       the manifest
//	tclone-branch/index.json        size and SHA-256 of every tree and file entry
//	tclone-branch/signature.json    the exporting host's ed25519 signature of
//	                                the manifest and the index
//	tclone-branch/chunks/<sha256>   every chunk it uses, as stored (named by its hash)
//	tclone-branch/trees/<tree>.tar  each tree, as packTree writes it
//	tclone-branch/files/<name>      its other files (the checkpoint archive)
//
// So the signature, checked before anything is written, covers everything:
// the manifest names each chunk by its hash, and the index each other
// entry by its. An archive of tclone before signatures (no index, no
// signature; trees packed by GNU tar) is read only with InsecureUnsigned.
const (
	archiveRoot      = "tclone-branch/"
	archiveManifest  = archiveRoot + "branch.json"
	archiveIndex     = archiveRoot + "index.json"
	archiveSignature = archiveRoot + "signature.json"
	archiveChunks    = archiveRoot + "chunks/"
	archiveTrees     = archiveRoot + "trees/"
	archiveFiles     = archiveRoot + "files/"
)

// Bounds on an archive's own entries.
const (
	maxIndexBytes       = 1 << 20
	maxSignatureBytes   = 4 << 10
	maxArchiveFileBytes = 64 << 20
	maxArchiveFiles     = 16
	maxTreeBytes        = 1 << 44
	// The zstd window an export uses, and the most an import accepts
	// (branches exported before this bound used zstd's default of 8 MiB).
	exportWindow = 8 << 20
	maxWindow    = 64 << 20
)

var fileNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// index is index.json.
type index struct {
	Version int          `json:"version"`
	Entries []indexEntry `json:"entries"`
}

type indexEntry struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// signature is signature.json.
type signature struct {
	Algorithm string `json:"algorithm"`
	Key       string `json:"key"`
	Signature string `json:"signature"`
}

// signedMessage is what an archive's signature signs: the hashes of its
// manifest and its index, under a context string of its own.
func signedMessage(manifest, idx []byte) []byte {
	m, i := sha256.Sum256(manifest), sha256.Sum256(idx)
	return fmt.Appendf(nil, "tclone branch archive, version 2\nmanifest %x\nindex %x\n", m, i)
}

// ExportTo writes branch ref to out, signed with key, as Export does to a
// file.
func (s Store) ExportTo(ref string, out io.Writer, key *signing.Key) (*Branch, error) {
	b, release, err := s.exportable(ref)
	if err != nil {
		return nil, err
	}
	defer release()
	return b, s.export(b, out, key)
}

// exportable finds branch ref, checked, and holds the store for reading
// it until release.
func (s Store) exportable(ref string) (b *Branch, release func(), err error) {
	if release, err = s.use(); err != nil {
		return nil, nil, err
	}
	if b, err = s.Get(ref); err == nil {
		if err = b.Check(); err != nil {
			err = fmt.Errorf("branch %s cannot be exported: %w", b.Name, err)
		}
	}
	if err != nil {
		release()
		return nil, nil, err
	}
	return b, release, nil
}

// Export writes branch ref to path, signed with key, atomically: a failure
// leaves no file.
func (s Store) Export(ref, dest string, key *signing.Key) (*Branch, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("exporting branch %s: %w", ref, err)
	}
	b, err := s.ExportTo(ref, tmp, key)
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

// exportEntry is a tree or file entry, packed beforehand so that its size
// and hash go into the index.
type exportEntry struct {
	indexEntry
	path string
}

// signedHead is an export's manifest, index and signature, and the tree
// and file entries the index lists (trees packed into scratch).
type signedHead struct {
	manifest, index, signature []byte
	entries                    []exportEntry
}

func (s Store) signedHead(b *Branch, scratch string, key *signing.Key) (*signedHead, error) {
	entries, err := s.exportEntries(b, scratch)
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	idx := index{Version: 2}
	for _, e := range entries {
		idx.Entries = append(idx.Entries, e.indexEntry)
	}
	idxData, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	sig, err := json.Marshal(signature{
		Algorithm: "ed25519",
		Key:       key.Public().String(),
		Signature: base64.StdEncoding.EncodeToString(key.Sign(signedMessage(manifest, idxData))),
	})
	if err != nil {
		return nil, err
	}
	return &signedHead{manifest: manifest, index: idxData, signature: sig, entries: entries}, nil
}

func (s Store) export(b *Branch, out io.Writer, key *signing.Key) error {
	scratch, err := os.MkdirTemp(s.Dir, ".export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	head, err := s.signedHead(b, scratch, key)
	if err != nil {
		return err
	}
	manifest, idxData, sig, entries := head.manifest, head.index, head.signature, head.entries
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(exportWindow))
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, e := range []struct {
		name string
		data []byte
	}{{archiveManifest, manifest}, {archiveIndex, idxData}, {archiveSignature, sig}} {
		if err := writeEntry(tw, e.name, e.data); err != nil {
			return err
		}
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
	for _, e := range entries {
		if err := addFile(tw, e.path, archiveRoot+e.Name); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// exportEntries packs each tree into scratch and lists the branch's other
// files, each with its size and hash.
func (s Store) exportEntries(b *Branch, scratch string) ([]exportEntry, error) {
	dir := s.dirOf(b.ID)
	var out []exportEntry
	for i, t := range b.Trees {
		packed := filepath.Join(scratch, fmt.Sprintf("tree-%d.tar", i))
		if err := packTreeTo(filepath.Join(dir, t), packed); err != nil {
			return nil, err
		}
		e, err := hashedEntry("trees/"+t+".tar", packed)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	names, err := readDirNames(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		st, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() || name == "branch.json" {
			continue
		}
		e, err := hashedEntry("files/"+name, filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func packTreeTo(dir, dest string) error {
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = packTree(dir, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func hashedEntry(name, path string) (exportEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return exportEntry{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return exportEntry{}, fmt.Errorf("hashing %s: %w", path, err)
	}
	return exportEntry{indexEntry: indexEntry{Name: name, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, path: path}, nil
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
	_, err = io.CopyN(tw, f, st.Size())
	return err
}

// ErrNotBranchArchive reports a file that is no exported branch.
var ErrNotBranchArchive = errors.New("not a branch exported by podman container branch export")

// ErrUntrusted reports an archive whose origin this host cannot vouch
// for: unsigned, or signed by a key it does not trust.
var ErrUntrusted = errors.New("branch archive not trusted")

// ImportOptions say how an archive is imported.
type ImportOptions struct {
	// Name is the branch's name here; empty keeps its own.
	Name string
	// Trust is the keys whose signature is accepted.
	Trust *signing.Trust
	// InsecureUnsigned accepts an archive without a signature, or with one
	// of a key Trust lacks. A signature that does not verify is refused
	// all the same.
	InsecureUnsigned bool
	// Prepare sees the manifest, checked, before anything is written. It
	// may refuse it (an image this host lacks); it returns the rules for
	// the special files of its trees.
	Prepare func(*Branch) (TreeRules, error)
}

// Imported is what the importing host records about an imported branch
// (never taken from the archive).
type Imported struct {
	At time.Time `json:"at"`
	// Key is the public key that signed the archive ("" if unsigned), and
	// Trusted whether this host trusted it.
	Key     string `json:"key,omitempty"`
	Trusted bool   `json:"trusted"`
}

// Import reads a branch exported to src into the store. A failure leaves
// no branch.
func (s Store) Import(src string, opts ImportOptions) (*Branch, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return s.ImportFrom(f, src, opts)
}

// importer reads one archive.
type importer struct {
	src  string
	tr   *tar.Reader
	opts ImportOptions
	m    Branch
	// raw manifest and index, for the signature; idx is nil for an
	// archive written before signatures.
	manifest []byte
	idx      map[string]indexEntry
	chunks   map[string]int64 // chunk sizes the manifest gives
	signer   *Imported
	next     *tar.Header // read but not yet handled
}

// ImportFrom is Import of the archive read from in, which src names in
// errors.
func (s Store) ImportFrom(in io.Reader, src string, opts ImportOptions) (*Branch, error) {
	zr, err := zstd.NewReader(in, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, ErrNotBranchArchive)
	}
	defer zr.Close()
	return s.importTar(tar.NewReader(zr), src, opts)
}

// importTar imports the archive's tar stream, decompressed.
func (s Store) importTar(tr *tar.Reader, src string, opts ImportOptions) (*Branch, error) {
	im := &importer{src: src, tr: tr, opts: opts}
	if err := im.readHead(); err != nil {
		return nil, err
	}
	rules := TreeRules{}
	if opts.Prepare != nil {
		var err error
		if rules, err = opts.Prepare(&im.m); err != nil {
			return nil, err
		}
	}
	name := opts.Name
	if name == "" {
		name = im.m.Name
	}
	w, err := s.Begin(name, im.m.Source)
	if err != nil {
		return nil, err
	}
	if err := im.readBody(w, rules); err != nil {
		w.Abort()
		return nil, fmt.Errorf("importing %s: %w", src, err)
	}
	m := im.m
	return w.Commit(func(b *Branch) {
		id, added, trees := b.ID, b.Size.ChunksAdded, b.Size.Trees
		*b = m
		b.ID, b.Name, b.Size.ChunksAdded, b.Size.Trees = id, name, added, trees
		b.Imported = im.signer
		b.Imported.At = time.Now().UTC()
	})
}

// readHead reads and checks the manifest, the index and the signature:
// nothing is written before they pass.
func (im *importer) readHead() error {
	h, err := im.tr.Next()
	if err != nil || h.Name != archiveManifest {
		return fmt.Errorf("%s: %w (it does not begin with %s)", im.src, ErrNotBranchArchive, archiveManifest)
	}
	if im.manifest, err = readSmall(im.tr, h, maxManifestBytes); err != nil {
		return fmt.Errorf("%s: %w: its manifest: %v", im.src, ErrNotBranchArchive, err)
	}
	if err := json.Unmarshal(im.manifest, &im.m); err != nil {
		return fmt.Errorf("%s: %w: its manifest does not decode: %v", im.src, ErrNotBranchArchive, err)
	}
	if err := im.m.Check(); err != nil {
		return fmt.Errorf("%s: %w", im.src, err)
	}
	if im.opts.Name != "" {
		if err := CheckName(im.opts.Name); err != nil {
			return err
		}
	}
	if im.chunks, err = checkFiles(im.m.Files); err != nil {
		return err
	}
	if im.next, err = im.tr.Next(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w: %v", im.src, ErrNotBranchArchive, err)
	}
	if im.next == nil || im.next.Name != archiveIndex {
		return im.untrusted(nil, "it is unsigned (written by a tclone without signatures)")
	}
	idxData, err := readSmall(im.tr, im.next, maxIndexBytes)
	if err != nil {
		return fmt.Errorf("%s: %w: its index: %v", im.src, ErrNotBranchArchive, err)
	}
	if err := im.readIndex(idxData); err != nil {
		return err
	}
	if im.next, err = im.tr.Next(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w: %v", im.src, ErrNotBranchArchive, err)
	}
	if im.next == nil || im.next.Name != archiveSignature {
		return im.untrusted(nil, "it is unsigned")
	}
	sigData, err := readSmall(im.tr, im.next, maxSignatureBytes)
	if err != nil {
		return fmt.Errorf("%s: %w: its signature: %v", im.src, ErrNotBranchArchive, err)
	}
	im.next = nil
	return im.verify(sigData, idxData)
}

func (im *importer) readIndex(data []byte) error {
	var idx index
	if err := json.Unmarshal(data, &idx); err != nil || idx.Version != 2 {
		return fmt.Errorf("%s: %w: its index does not decode as version 2", im.src, ErrNotBranchArchive)
	}
	if len(idx.Entries) > len(im.m.Trees)+maxArchiveFiles {
		return invalid("the index lists %d entries", len(idx.Entries))
	}
	im.idx = map[string]indexEntry{}
	trees := map[string]bool{}
	for _, t := range im.m.Trees {
		trees["trees/"+t+".tar"] = true
	}
	for _, e := range idx.Entries {
		base, isFile := cutPrefix(e.Name, "files/")
		switch {
		case isFile && (!fileNameRE.MatchString(base) || base == "branch.json" || base == "lock" || base == partialFile || base == failedFile):
			return invalid("the index lists file %.100q", e.Name)
		case !isFile && !trees[e.Name]:
			return invalid("the index lists %.100q, which is no tree of the manifest", e.Name)
		case e.Size < 0 || (isFile && e.Size > maxArchiveFileBytes) || e.Size > maxTreeBytes:
			return invalid("the index gives %s a size of %d", e.Name, e.Size)
		case !hashRE.MatchString(e.SHA256):
			return invalid("the index gives %s the hash %.80q", e.Name, e.SHA256)
		}
		if _, dup := im.idx[e.Name]; dup {
			return invalid("the index lists %s twice", e.Name)
		}
		im.idx[e.Name] = e
	}
	for t := range trees {
		if _, ok := im.idx[t]; !ok {
			return invalid("the index lacks %s", t)
		}
	}
	return nil
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// verify checks the signature: a bad one is refused whatever the options;
// a good one of an unknown key only with InsecureUnsigned.
func (im *importer) verify(sigData, idxData []byte) error {
	var sig signature
	if err := json.Unmarshal(sigData, &sig); err != nil || sig.Algorithm != "ed25519" {
		return fmt.Errorf("%s: %w: its signature does not decode as an ed25519 one", im.src, ErrNotBranchArchive)
	}
	key, err := signing.ParsePublicKey(sig.Key)
	if err != nil {
		return fmt.Errorf("%s: %w: its signature's key: %v", im.src, ErrNotBranchArchive, err)
	}
	raw, err := base64.StdEncoding.DecodeString(sig.Signature)
	if err != nil || !key.Verify(signedMessage(im.manifest, idxData), raw) {
		return fmt.Errorf("%w: %s: its signature by %s does not match its contents: the archive was changed after it was exported, or is damaged", ErrUntrusted, im.src, key.Fingerprint())
	}
	if im.opts.Trust != nil && im.opts.Trust.Trusts(key) {
		im.signer = &Imported{Key: key.String(), Trusted: true}
		return nil
	}
	return im.untrusted(key, fmt.Sprintf("it is signed by %s, a key this host does not trust", key.Fingerprint()))
}

// untrusted refuses an archive unless InsecureUnsigned accepts it.
func (im *importer) untrusted(key signing.PublicKey, why string) error {
	if im.opts.InsecureUnsigned {
		im.signer = &Imported{}
		if key != nil {
			im.signer.Key = key.String()
		}
		return nil
	}
	trusted := "none"
	if im.opts.Trust != nil && len(im.opts.Trust.Sources) > 0 {
		trusted = fmt.Sprint(im.opts.Trust.Sources)
	}
	how := "export it again with a tclone that signs"
	if key != nil {
		dir := "the trusted-keys directory"
		if im.opts.Trust != nil && im.opts.Trust.Dir != "" {
			dir = im.opts.Trust.Dir
		}
		how = fmt.Sprintf("trust its key if you trust the host that exported it: --trust '%s' (that host prints it with `podman container branch key`), or a file holding it in %s", key, dir)
	}
	return fmt.Errorf("%w: %s: %s (trusted here: %s); %s, or import it with --insecure-unsigned, which lets the archive's CRIU images and files run as root in the containers started from it",
		ErrUntrusted, im.src, why, trusted, how)
}

// readSmall reads an entry that must fit in memory.
func readSmall(r io.Reader, h *tar.Header, limit int64) ([]byte, error) {
	if h.Typeflag != tar.TypeReg || h.Size < 0 || h.Size > limit {
		return nil, fmt.Errorf("entry %s of type %q and %d bytes (at most %d)", h.Name, h.Typeflag, h.Size, limit)
	}
	data := make([]byte, h.Size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, err
	}
	return data, nil
}

// readBody reads every entry after the head into the writer's branch.
func (im *importer) readBody(w *Writer, rules TreeRules) error {
	seen := map[string]bool{}
	chunksSeen := map[string]bool{}
	for {
		h := im.next
		im.next = nil
		if h == nil {
			var err error
			if h, err = im.tr.Next(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("%w: %v", ErrNotBranchArchive, err)
			}
		}
		name, ok := cutPrefix(h.Name, archiveRoot)
		if !ok || h.Typeflag != tar.TypeReg || seen[name] {
			return invalid("entry %.200q (type %q) is not one of a branch archive, or comes twice", h.Name, h.Typeflag)
		}
		seen[name] = true
		if hash, isChunk := cutPrefix(name, "chunks/"); isChunk {
			size, wanted := im.chunks[hash]
			if !wanted {
				return invalid("chunk %.80q is not one of the manifest's", hash)
			}
			if err := im.chunk(w, h, hash, size); err != nil {
				return err
			}
			chunksSeen[hash] = true
			continue
		}
		if err := im.entry(w, h, name, rules); err != nil {
			return err
		}
	}
	// Every chunk the manifest lists must have come in this archive: one
	// found in the store instead would be another branch's memory, which
	// an export of this one would then hand out.
	for hash := range im.chunks {
		if !chunksSeen[hash] {
			return fmt.Errorf("%w: the archive lacks chunk %s", ErrCorrupt, hash)
		}
	}
	for _, t := range im.m.Trees {
		if !seen["trees/"+t+".tar"] {
			return fmt.Errorf("%w: the archive lacks tree %s", ErrCorrupt, t)
		}
	}
	for name := range im.idx {
		if !seen[name] {
			return fmt.Errorf("%w: the archive lacks %s, which its index lists", ErrCorrupt, name)
		}
	}
	return nil
}

func (im *importer) chunk(w *Writer, h *tar.Header, hash string, size int64) error {
	packed, err := readSmall(im.tr, h, maxPackedChunk)
	if err != nil {
		return invalid("chunk %s: %v", hash, err)
	}
	added, err := w.store.chunks().putPacked(hash, packed, size)
	w.b.Size.ChunksAdded += added
	return err
}

// entry reads a tree or a file, checking it against the index.
func (im *importer) entry(w *Writer, h *tar.Header, name string, rules TreeRules) error {
	var want *indexEntry
	if im.idx != nil {
		e, ok := im.idx[name]
		if !ok {
			return invalid("entry %.200q is not in the archive's index", h.Name)
		}
		if e.Size != h.Size {
			return fmt.Errorf("%w: %s has %d bytes, its index says %d", ErrCorrupt, name, h.Size, e.Size)
		}
		want = &e
	}
	in := &hashingReader{r: io.LimitReader(im.tr, h.Size), h: sha256.New()}
	var err error
	switch base, isFile := cutPrefix(name, "files/"); {
	case isFile:
		err = w.readFile(in, base, h.Size)
	default:
		err = im.tree(w, in, name, rules)
	}
	if err != nil {
		return err
	}
	// What the unpacking left unread (tar's padding) is hashed too.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return err
	}
	if in.n != h.Size {
		return fmt.Errorf("%w: %s is cut short", ErrCorrupt, name)
	}
	if got := hex.EncodeToString(in.h.Sum(nil)); want != nil && got != want.SHA256 {
		return fmt.Errorf("%w: %s has SHA-256 %s, its signed index says %s", ErrCorrupt, name, got, want.SHA256)
	}
	return nil
}

func (im *importer) tree(w *Writer, in io.Reader, name string, rules TreeRules) error {
	rel, ok := cutPrefix(name, "trees/")
	rel = trimSuffix(rel, ".tar")
	if !ok || !checkTreeName(im.m.Trees, rel) {
		return invalid("entry %.200q is no tree of the manifest", name)
	}
	dst := filepath.Join(w.dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	n, err := extractTree(in, dst, rel, rules)
	if err != nil {
		return err
	}
	w.b.Trees = append(w.b.Trees, rel)
	w.b.Size.Trees += n
	return nil
}

func checkTreeName(trees []string, t string) bool {
	for _, x := range trees {
		if x == t {
			return true
		}
	}
	return false
}

func trimSuffix(s, suffix string) string {
	if len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)]
	}
	return s
}

// readFile keeps one of the archive's files (the checkpoint archive).
func (w *Writer) readFile(in io.Reader, base string, size int64) error {
	if !fileNameRE.MatchString(base) || base == "branch.json" || base == "lock" || base == partialFile || base == failedFile {
		return invalid("file %.100q", base)
	}
	if size > maxArchiveFileBytes {
		return invalid("file %s has %d bytes (at most %d)", base, size, maxArchiveFileBytes)
	}
	return copyfile.From(in, filepath.Join(w.dir, base), newFile)
}

type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (r *hashingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	r.n += int64(n)
	return n, err
}

// putPacked stores a chunk as it was stored elsewhere, after checking that
// it holds what its hash says, and has the size its manifest gives.
func (c chunkStore) putPacked(hash string, packed []byte, size int64) (int64, error) {
	if !hashRE.MatchString(hash) || size <= 0 || size > maxChunkBytes {
		return 0, invalid("chunk %.80q of %d bytes", hash, size)
	}
	data, err := boundedDecoder().DecodeAll(packed, make([]byte, 0, size))
	if err != nil {
		return 0, fmt.Errorf("%w: chunk %s does not decompress within %d bytes: %v", ErrCorrupt, hash, maxChunkBytes, err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != hash || int64(len(data)) != size {
		return 0, fmt.Errorf("%w: chunk %s holds %d bytes with hash %s (want %d)", ErrCorrupt, hash, len(data), got, size)
	}
	if _, err := os.Stat(c.path(hash)); err == nil {
		return 0, nil
	}
	return c.write(hash, packed)
}
