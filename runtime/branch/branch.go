// Package branch keeps durable branches: named captures of a running
// container, written to disk after the source resumed, from which siblings
// can be started any number of times, after the source is gone or the host
// rebooted.
//
// A branch is a fork plan (see package plan) made durable. Its files (the
// CRIU images, page images above all) are cut into chunks stored once by
// their SHA-256 and compressed with zstd, so branches of one workspace
// share what did not change between them; its root filesystem capture and
// volume copies are kept as directories.
//
//	<Dir>/chunks/<hh>/<sha256>     chunks, shared by every branch
//	<Dir>/branches/<id>/branch.json the branch's manifest
//	<Dir>/branches/<id>/...        its trees and the checkpoint archive
//	<Dir>/.partial/<id>/           a branch being written; its lock file is
//	                               held by the writer while it lives
//	<Dir>/lock                     shared by writers and readers, taken
//	                               whole only to collect unused chunks
//	<Dir>/names.lock               serialises names
//
// A branch appears in branches/ only once complete (renamed there from
// .partial/), so a writer killed at any point leaves nothing visible, and
// Collect removes what it wrote.
package branch

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/plan"
)

// FormatVersion is the branch.json layout version this build reads and
// writes.
const FormatVersion = 1

// Branch is branch.json.
type Branch struct {
	Version   int               `json:"version"`
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	CreatedAt time.Time         `json:"created_at"`
	DurableAt time.Time         `json:"durable_at"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Parent is the branch the source was started from, if any.
	Parent string `json:"parent,omitempty"`
	Source Source `json:"source"`
	// Plan is the capture's plan (its plan.json) as it was taken; its paths
	// name where it lived then, not where the branch keeps it.
	Plan plan.Plan `json:"plan"`
	// Files are the plan directory's files, by path relative to it.
	Files []File `json:"files"`
	// Trees are the directories kept whole, by their path in the branch.
	Trees []string `json:"trees,omitempty"`
	// Engine is what the fork engine that made the branch needs to start
	// siblings from it; this package does not read it.
	Engine json.RawMessage `json:"engine,omitempty"`
	Size   Size            `json:"size"`
	// Imported is set by this host's import (whatever the archive said):
	// a branch from elsewhere, which a start trusts less than its own.
	Imported *Imported `json:"imported,omitempty"`
}

// Source is what a branch remembers of the container it was taken from.
type Source struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Image   string `json:"image"`
	ImageID string `json:"image_id"`
}

// Is reports whether ref names this source: its name, its ID, or a prefix
// of its ID of 12 digits or more; "" names every source.
func (s Source) Is(ref string) bool {
	return ref == "" || s.Name == ref || s.ID == ref || (len(ref) >= 12 && strings.HasPrefix(s.ID, ref))
}

// File is one file of a branch's plan.
type File struct {
	Path   string      `json:"path"`
	Mode   os.FileMode `json:"mode"`
	Size   int64       `json:"size"`
	Chunks []Chunk     `json:"chunks"`
}

// Size says how big a branch is.
type Size struct {
	// Files is the plan's files' size, as they are read back.
	Files int64 `json:"files"`
	// ChunksAdded is what the branch's chunks took on disk when it was
	// made: chunks other branches already had cost nothing.
	ChunksAdded int64 `json:"chunks_added"`
	// Trees is the root filesystem capture's and volume copies' size.
	Trees int64 `json:"trees"`
}

// Info is a branch as listed: committed ones are durable; one still being
// written has only its name, ID, source and start time.
type Info struct {
	*Branch
	State State `json:"state"`
	// Error says why a failed branch failed.
	Error string `json:"error,omitempty"`
}

// State of a branch.
type State string

const (
	StateWriting State = "writing"
	StateDurable State = "durable"
	// StateFailed is a branch whose writing failed after its command
	// returned (create --wait runnable): it stays listed, with why, until
	// it is removed (rm, or tclone gc).
	StateFailed State = "failed"
)

// What a branch made by a fork engine keeps besides its plan's files.
const (
	// RootfsTree is the root filesystem capture.
	RootfsTree = "rootfs"
	// ArchiveFile is the engine's checkpoint archive.
	ArchiveFile = "checkpoint.tar"
)

// VolumeTree is the copy of the plan's volume i.
func VolumeTree(i int) string { return fmt.Sprintf("volumes/%d", i) }

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// CheckName refuses a name a branch cannot have.
func CheckName(name string) error {
	if !nameRE.MatchString(name) || len(name) > 128 {
		return fmt.Errorf("invalid branch name %q: use letters, digits, _, . and - (starting with a letter or digit), at most 128 characters", name)
	}
	if idRE.MatchString(name) {
		return fmt.Errorf("invalid branch name %q: it has the form of a branch ID; choose a name that is not 16 hexadecimal digits", name)
	}
	return nil
}

var idRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func newID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// ErrNotFound reports a branch no name or ID matches; ErrNameTaken a name
// another branch has.
var (
	ErrNotFound  = errors.New("no such branch")
	ErrNameTaken = errors.New("branch name taken")
)

// Store is the branch store in Dir.
type Store struct{ Dir string }

// StoreOf is the branch store of a host's layout (plan.Layout.Branches).
func StoreOf(l plan.Layout) Store { return Store{Dir: l.Branches} }

func (s Store) chunks() chunkStore          { return chunkStore{dir: filepath.Join(s.Dir, "chunks")} }
func (s Store) committedDir() string        { return filepath.Join(s.Dir, "branches") }
func (s Store) partialDir() string          { return filepath.Join(s.Dir, ".partial") }
func (s Store) trashDir() string            { return filepath.Join(s.Dir, ".trash") }
func (s Store) dirOf(id string) string      { return filepath.Join(s.committedDir(), id) }
func (s Store) manifestOf(id string) string { return filepath.Join(s.dirOf(id), "branch.json") }

// Path is where branch b keeps rel (a tree or file it was given).
func (s Store) Path(b *Branch, rel string) string { return filepath.Join(s.dirOf(b.ID), rel) }

func (s Store) init() error {
	for _, d := range []string{s.Dir, s.committedDir(), s.partialDir(), s.trashDir(), s.chunks().dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating the branch store %s: %w", d, err)
		}
	}
	return nil
}

func readManifest(path string) (*Branch, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var b Branch
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%w: %s does not decode: %v", ErrCorrupt, path, err)
	}
	if b.Version != FormatVersion {
		return nil, fmt.Errorf("%s has format version %d; this tclone reads version %d", path, b.Version, FormatVersion)
	}
	return &b, nil
}
