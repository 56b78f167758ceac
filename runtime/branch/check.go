package branch

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/tclone/tclone/runtime/rootfs"
)

// Limits on what a manifest may describe. A branch made here stays far
// inside them; an archive beyond them is refused before anything is
// written, so that no size read from it becomes an allocation.
const (
	// maxChunkBytes is the largest chunk the chunker cuts (maxPages pages).
	maxChunkBytes = maxPages * pageSize
	// maxPackedChunk bounds a stored chunk: zstd's worst case for
	// maxChunkBytes of incompressible data is a few hundred bytes more.
	maxPackedChunk = maxChunkBytes + 64<<10
	// maxFileBytes bounds one plan file (a page image).
	maxFileBytes = 1 << 40
	maxFiles     = 1 << 20
	maxChunks    = 1 << 26
	// maxManifestBytes bounds branch.json in an archive.
	maxManifestBytes = 64 << 20
	maxLabels        = 1024
	maxLabelBytes    = 4096
)

// ErrInvalid marks a manifest that breaks a rule every branch this host
// makes keeps: a path that leaves its directory, a tree that is not one of
// a branch's, a chunk name that is not a hash, a size out of bounds.
var ErrInvalid = errors.New("invalid branch manifest")

var (
	hashRE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	containerRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	volumeRE    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Check refuses a manifest that could not have been made by a branch
// writer: it is what an import and a start trust about a branch.
func (b *Branch) Check() error {
	if b.Version != FormatVersion {
		return fmt.Errorf("branch %s has format version %d; this tclone reads version %d", b.Name, b.Version, FormatVersion)
	}
	if err := CheckName(b.Name); err != nil {
		return invalid("%v", err)
	}
	if b.ID != "" && !idRE.MatchString(b.ID) {
		return invalid("branch ID %q is not 16 hexadecimal digits", b.ID)
	}
	if b.Parent != "" && !idRE.MatchString(b.Parent) {
		return invalid("parent %q is not a branch ID", b.Parent)
	}
	if err := b.Source.check(); err != nil {
		return err
	}
	if len(b.Labels) > maxLabels {
		return invalid("%d labels (at most %d)", len(b.Labels), maxLabels)
	}
	for k, v := range b.Labels {
		if k == "" || len(k)+len(v) > maxLabelBytes {
			return invalid("label %.40q is empty or longer than %d bytes", k, maxLabelBytes)
		}
	}
	if err := b.checkPlan(); err != nil {
		return err
	}
	if err := checkTrees(b.Trees, b.Plan.Rootfs != nil, len(b.Plan.Volumes)); err != nil {
		return err
	}
	_, err := checkFiles(b.Files)
	return err
}

func (s Source) check() error {
	switch {
	case s.ID != "" && !containerRE.MatchString(s.ID):
		return invalid("source ID %q is not a container ID", s.ID)
	case s.ImageID != "" && !containerRE.MatchString(s.ImageID):
		return invalid("image ID %q is not an image ID", s.ImageID)
	case s.Name != "" && !nameRE.MatchString(s.Name):
		return invalid("source name %q is not a container name", s.Name)
	case len(s.Image) > 1024 || strings.ContainsFunc(s.Image, isControl):
		return invalid("image name %.60q", s.Image)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// checkPlan checks what a start takes from the capture's plan. Its host
// paths (the rootfs capture's, its lower layers, the volume copies') are
// never used: a start derives them on this host.
func (b *Branch) checkPlan() error {
	p := &b.Plan
	if p.Snapshots != nil {
		return invalid("the plan records copy-on-write snapshots, which no branch holds")
	}
	if p.Rootfs != nil {
		switch p.Rootfs.Kind {
		case rootfs.KindOverlay, rootfs.KindDir, rootfs.KindBtrfs:
		default:
			return invalid("root filesystem capture of kind %q", p.Rootfs.Kind)
		}
	}
	for i, v := range p.Volumes {
		if !filepath.IsAbs(v.Destination) || filepath.Clean(v.Destination) != v.Destination {
			return invalid("volume %d is mounted at %q, not a clean absolute path", i, v.Destination)
		}
		if v.Name != "/dev/shm" && !volumeRE.MatchString(v.Name) {
			return invalid("volume %d is called %q, not a volume name", i, v.Name)
		}
	}
	for _, t := range p.Tree.Tasks {
		if len(t.Comm) > 64 || strings.ContainsFunc(t.Comm, isControl) {
			return invalid("process %d is called %.40q", t.Pid, t.Comm)
		}
	}
	if h := p.Source.Hostname; len(h) > 253 || strings.ContainsFunc(h, func(r rune) bool { return isControl(r) || r == ' ' || r == '/' }) {
		return invalid("source hostname %.60q", h)
	}
	return nil
}

// checkTrees accepts exactly the trees a branch writer keeps: the root
// filesystem capture when there is one, and volumes/<i> for each of the
// plan's volumes, each once.
func checkTrees(trees []string, rootfs bool, volumes int) error {
	want := map[string]bool{}
	if rootfs {
		want[RootfsTree] = true
	}
	for i := range volumes {
		want[VolumeTree(i)] = true
	}
	seen := map[string]bool{}
	for _, t := range trees {
		if !want[t] {
			return invalid("tree %q is not one a branch keeps (%s, and %s for each of its %d volumes)", t, RootfsTree, "volumes/<n>", volumes)
		}
		if seen[t] {
			return invalid("tree %q is listed twice", t)
		}
		seen[t] = true
	}
	for t := range want {
		if !seen[t] {
			return invalid("tree %q is missing", t)
		}
	}
	return nil
}

// reservedFiles are the plan directory's own files, never a branch's.
var reservedFiles = map[string]bool{"plan.json": true, "lock": true, "uses": true}

// checkFiles checks the plan files of a manifest and returns the size each
// chunk hash has (a hash names one content, so one size).
func checkFiles(files []File) (map[string]int64, error) {
	if len(files) > maxFiles {
		return nil, invalid("%d files (at most %d)", len(files), maxFiles)
	}
	paths := map[string]bool{}
	sizes := map[string]int64{}
	chunks := 0
	for _, f := range files {
		if !filepath.IsLocal(f.Path) || filepath.Clean(f.Path) != f.Path || strings.ContainsRune(f.Path, 0) {
			return nil, invalid("file %q is not a clean path inside the plan", f.Path)
		}
		if reservedFiles[f.Path] {
			return nil, invalid("file %q is the plan's own", f.Path)
		}
		if paths[f.Path] {
			return nil, invalid("file %q is listed twice", f.Path)
		}
		paths[f.Path] = true
		if f.Mode&^0o777 != 0 {
			return nil, invalid("file %s has mode %v: plan files have permission bits only", f.Path, f.Mode)
		}
		if f.Size < 0 || f.Size > maxFileBytes {
			return nil, invalid("file %s has size %d", f.Path, f.Size)
		}
		chunks += len(f.Chunks)
		if chunks > maxChunks {
			return nil, invalid("more than %d chunks", maxChunks)
		}
		var total int64
		for _, c := range f.Chunks {
			if !hashRE.MatchString(c.Hash) {
				return nil, invalid("file %s has chunk %.80q, which is not a SHA-256 in hexadecimal", f.Path, c.Hash)
			}
			if c.Size <= 0 || c.Size > maxChunkBytes {
				return nil, invalid("chunk %s of %s has size %d (1 to %d)", c.Hash, f.Path, c.Size, maxChunkBytes)
			}
			if s, ok := sizes[c.Hash]; ok && s != c.Size {
				return nil, invalid("chunk %s is listed with sizes %d and %d", c.Hash, s, c.Size)
			}
			sizes[c.Hash] = c.Size
			total += c.Size
		}
		if total != f.Size {
			return nil, invalid("file %s has size %d but its chunks hold %d bytes", f.Path, f.Size, total)
		}
	}
	// A file cannot also be a directory of another.
	for p := range paths {
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			if paths[d] {
				return nil, invalid("file %s is also the directory of %s", d, p)
			}
		}
	}
	return sizes, nil
}
