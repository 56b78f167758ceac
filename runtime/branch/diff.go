package branch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/rootfs"
)

// Diff is what differs between two branches.
type Diff struct {
	A        string        `json:"a"`
	B        string        `json:"b"`
	Lineage  Lineage       `json:"lineage"`
	Labels   []LabelChange `json:"labels"`
	Size     SizeDiff      `json:"size"`
	Process  ProcessDiff   `json:"processes"`
	Files    []FileChange  `json:"files"`
	Warnings []string      `json:"warnings,omitempty"`
}

// Lineage relates two branches.
type Lineage struct {
	SameSource bool   `json:"same_source"`
	SourceA    string `json:"source_a"`
	SourceB    string `json:"source_b"`
	// Relation is "a-ancestor-of-b", "b-ancestor-of-a", "same-source" or
	// "unrelated": an ancestor's sibling was the source of the other, or
	// of one of its ancestors.
	Relation string `json:"relation"`
}

// LabelChange is a label that differs; "" where a branch lacks it.
type LabelChange struct {
	Key string `json:"key"`
	A   string `json:"a"`
	B   string `json:"b"`
}

// SizeDiff compares sizes. SharedBytes are the bytes of B's files held in
// chunks A has too: what B costs nothing for, beside A.
type SizeDiff struct {
	A           Size  `json:"a"`
	B           Size  `json:"b"`
	SharedBytes int64 `json:"shared_bytes"`
}

// ProcessDiff lists the processes one branch has and the other has not,
// by PID (in the container) and command.
type ProcessDiff struct {
	OnlyA []plan.Process `json:"only_a"`
	OnlyB []plan.Process `json:"only_b"`
}

// FileChange is a root filesystem path that differs, as podman diff puts
// it: A (added in B), D (deleted in B), C (changed).
type FileChange struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
}

// Compare diffs branches a and b (names or IDs): b relative to a.
func (s Store) Compare(a, b string) (*Diff, error) {
	release, err := s.use()
	if err != nil {
		return nil, err
	}
	defer release()
	ba, err := s.Get(a)
	if err != nil {
		return nil, err
	}
	bb, err := s.Get(b)
	if err != nil {
		return nil, err
	}
	d := &Diff{A: ba.Name, B: bb.Name, Labels: []LabelChange{}, Files: []FileChange{}}
	d.Lineage = s.lineage(ba, bb)
	for _, k := range slices.Sorted(maps.Keys(union(ba.Labels, bb.Labels))) {
		if ba.Labels[k] != bb.Labels[k] {
			d.Labels = append(d.Labels, LabelChange{Key: k, A: ba.Labels[k], B: bb.Labels[k]})
		}
	}
	d.Size = SizeDiff{A: ba.Size, B: bb.Size, SharedBytes: sharedBytes(ba, bb)}
	d.Process = diffProcesses(ba.Plan.Tree.Tasks, bb.Plan.Tree.Tasks)
	files, warn, err := s.diffRootfs(ba, bb)
	if err != nil {
		return nil, err
	}
	d.Files, d.Warnings = files, warn
	return d, nil
}

func union(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}

func (s Store) lineage(a, b *Branch) Lineage {
	l := Lineage{SameSource: a.Source.ID == b.Source.ID, SourceA: a.Source.Name, SourceB: b.Source.Name, Relation: "unrelated"}
	switch {
	case s.descends(b, a.ID):
		l.Relation = "a-ancestor-of-b"
	case s.descends(a, b.ID):
		l.Relation = "b-ancestor-of-a"
	case l.SameSource:
		l.Relation = "same-source"
	}
	return l
}

// descends reports whether ancestor is among b's parents, as far as the
// branches are still there.
func (s Store) descends(b *Branch, ancestor string) bool {
	seen := map[string]bool{}
	for p := b.Parent; p != "" && !seen[p]; {
		if p == ancestor {
			return true
		}
		seen[p] = true
		parent, err := readManifest(s.manifestOf(p))
		if err != nil {
			return false
		}
		p = parent.Parent
	}
	return false
}

func sharedBytes(a, b *Branch) int64 {
	have := map[string]bool{}
	for _, f := range a.Files {
		for _, c := range f.Chunks {
			have[c.Hash] = true
		}
	}
	var n int64
	for _, f := range b.Files {
		for _, c := range f.Chunks {
			if have[c.Hash] {
				n += c.Size
			}
		}
	}
	return n
}

func diffProcesses(a, b []plan.Process) ProcessDiff {
	key := func(p plan.Process) string { return fmt.Sprintf("%d %s", p.Pid, p.Comm) }
	in := func(list []plan.Process) map[string]bool {
		m := map[string]bool{}
		for _, p := range list {
			m[key(p)] = true
		}
		return m
	}
	ina, inb := in(a), in(b)
	d := ProcessDiff{OnlyA: []plan.Process{}, OnlyB: []plan.Process{}}
	for _, p := range a {
		if !inb[key(p)] {
			d.OnlyA = append(d.OnlyA, p)
		}
	}
	for _, p := range b {
		if !ina[key(p)] {
			d.OnlyB = append(d.OnlyB, p)
		}
	}
	return d
}

// A path's state in a branch's root filesystem.
type pathState int

const (
	fromImage pathState = iota // not in the capture: as the image has it
	present
	absent // deleted: a whiteout, or under an opaque directory
)

// tree is a captured root filesystem: an overlay upper layer over the
// image (overlay), or a whole copy.
type tree struct {
	root    string
	overlay bool
	entries map[string]fs.FileInfo
	opaque  map[string]bool
}

func scanTree(root string, overlay bool) (*tree, error) {
	t := &tree{root: root, overlay: overlay, entries: map[string]fs.FileInfo{}, opaque: map[string]bool{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." {
			return nil
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		rel = "/" + rel
		t.entries[rel] = st
		if d.IsDir() && overlay && rootfs.IsOpaqueDir(path) {
			t.opaque[rel] = true
		}
		return nil
	})
	return t, err
}

func (t *tree) state(path string) (pathState, fs.FileInfo) {
	if st, ok := t.entries[path]; ok {
		if t.overlay && isWhiteout(st) {
			return absent, nil
		}
		return present, st
	}
	if !t.overlay {
		return absent, nil
	}
	for dir := filepath.Dir(path); dir != "/"; dir = filepath.Dir(dir) {
		if t.opaque[dir] {
			return absent, nil
		}
	}
	return fromImage, nil
}

func isWhiteout(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.Mode()&fs.ModeCharDevice != 0 && sys.Rdev == 0
}

// diffRootfs lists the root filesystem paths that differ from a to b.
func (s Store) diffRootfs(a, b *Branch) ([]FileChange, []string, error) {
	out := []FileChange{}
	if a.Plan.Rootfs == nil || b.Plan.Rootfs == nil {
		return out, []string{"a branch without a root filesystem capture: files not compared"}, nil
	}
	var warn []string
	overlay := a.Plan.Rootfs.Kind == rootfs.KindOverlay && b.Plan.Rootfs.Kind == rootfs.KindOverlay
	if overlay && !slices.Equal(a.Plan.Rootfs.LowerDirs, b.Plan.Rootfs.LowerDirs) {
		warn = append(warn, "the branches' images differ: files each left as its image has them are not compared")
	}
	ta, err := scanTree(s.Path(a, RootfsTree), overlay)
	if err != nil {
		return nil, nil, err
	}
	tb, err := scanTree(s.Path(b, RootfsTree), overlay)
	if err != nil {
		return nil, nil, err
	}
	inImage := func(path string) bool {
		for _, l := range a.Plan.Rootfs.LowerDirs {
			if st, err := os.Lstat(filepath.Join(l, path)); err == nil {
				return !isWhiteout(st)
			}
		}
		return false
	}
	paths := map[string]bool{}
	for p := range ta.entries {
		paths[p] = true
	}
	for p := range tb.entries {
		paths[p] = true
	}
	// An opaque directory hides what the image has under it: those paths
	// are deleted on its side.
	for _, t := range []*tree{ta, tb} {
		for dir := range t.opaque {
			for _, l := range a.Plan.Rootfs.LowerDirs {
				filepath.WalkDir(filepath.Join(l, dir), func(path string, _ fs.DirEntry, err error) error {
					if err == nil {
						rel, _ := filepath.Rel(l, path)
						paths["/"+rel] = true
					}
					return nil
				})
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		sa, fa := ta.state(p)
		sb, fb := tb.state(p)
		kind := ""
		switch {
		case sa == sb && sa != present:
		case sa == present && sb == present:
			if !sameEntry(filepath.Join(ta.root, p), fa, filepath.Join(tb.root, p), fb) {
				kind = "C"
			}
		case sb == absent:
			kind = "D"
		case sa == absent:
			kind = "A"
		case (fa != nil && fa.IsDir()) || (fb != nil && fb.IsDir()):
			// A directory copied up for what changed under it: the
			// changes below are what tells.
			if !inImage(p) {
				kind = map[bool]string{true: "A", false: "D"}[sb == present]
			}
		case inImage(p): // present on one side, as the image on the other
			kind = "C"
		case sb == present:
			kind = "A"
		default:
			kind = "D"
		}
		if kind != "" {
			out = append(out, FileChange{Kind: kind, Path: p})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, warn, nil
}

// sameEntry compares two files' type, mode, owner and contents (a
// directory's contents are its entries, compared one by one).
func sameEntry(pa string, a fs.FileInfo, pb string, b fs.FileInfo) bool {
	if a.Mode() != b.Mode() {
		return false
	}
	sa, oka := a.Sys().(*syscall.Stat_t)
	sb, okb := b.Sys().(*syscall.Stat_t)
	if oka && okb && (sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Rdev != sb.Rdev) {
		return false
	}
	switch {
	case a.Mode()&fs.ModeSymlink != 0:
		ta, _ := os.Readlink(pa)
		tb, _ := os.Readlink(pb)
		return ta == tb
	case a.Mode().IsRegular():
		return a.Size() == b.Size() && sameContents(pa, pb)
	}
	return true
}

func sameContents(pa, pb string) bool {
	fa, err := os.Open(pa)
	if err != nil {
		return false
	}
	defer fa.Close()
	fb, err := os.Open(pb)
	if err != nil {
		return false
	}
	defer fb.Close()
	bufA, bufB := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, bufA)
		nb, eb := io.ReadFull(fb, bufB)
		if na != nb || !bytes.Equal(bufA[:na], bufB[:nb]) {
			return false
		}
		if errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF) {
			return errors.Is(eb, io.EOF) || errors.Is(eb, io.ErrUnexpectedEOF)
		}
		if ea != nil || eb != nil {
			return false
		}
	}
}
