// Package pagedelta turns a dump's page images into CRIU's incremental
// form over an earlier dump of the same tree, and back.
//
// CRIU restores a pagemap entry flagged PE_PARENT from the images
// directory's "parent" directory: the parent's pagemap of the same task,
// and the pages image it names, at the same addresses. Delta rewrites a
// full dump so that every page whose bytes the parent holds at the same
// address is read from there, and only the others stay in its own pages
// images. The parent directory it writes holds copies of the parent's
// pagemaps and, in place of the parent's pages images, links to
// "../pages-<id>.img": the layout of a checkpoint image layer over the
// parent's layer, where the union holds the parent's pages images beside
// the delta's (which get ids of their own, so that none hides one of the
// parent's). Stock CRIU restores such a directory as it is; AssembleAll
// writes the tasks' full pages images back from it.
package pagedelta

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks/internal/pagemapimg"
)

// ParentDir is the directory in an images directory where CRIU looks for
// the parent dump (CR_PARENT_LINK).
const ParentDir = "parent"

const pageSize = pagemapimg.PageSize

var (
	taskPagemapRE = regexp.MustCompile(`^pagemap-[0-9]+\.img$`)
	anyPagemapRE  = regexp.MustCompile(`^pagemap-(shmem-)?[0-9]+\.img$`)
	pagesRE       = regexp.MustCompile(`^pages-([0-9]+)\.img$`)
)

// IsPagesImage reports whether name is a pages image's (pages-<id>.img).
func IsPagesImage(name string) bool { return pagesRE.MatchString(name) }

// deltaIDBase numbers the delta's pages images: CRIU numbers its own from 1,
// a few per dump, and lazypages' drained ones are 1<<30 | pid.
const deltaIDBase = 1 << 29

// Stats is what Delta did.
type Stats struct {
	// Pages are the present pages of the dump; InParent those now read
	// from the parent.
	Pages, InParent int64
	// Pagemaps is how many pagemaps were rewritten.
	Pagemaps int
}

// Delta rewrites the images directory dir, a dump with every page in its
// own pages images, into a delta over parent, the images directory of an
// earlier full dump. The task pagemaps of dir are compared page by page with
// parent's of the same task; shared-memory pagemaps keep every page. Every
// pages image of dir gets a new id (its pagemap's head names it), the old
// ones are removed, and dir/parent is written as the package comment says.
// Delta refuses a directory that is not a dump of full page images; a
// failure leaves dir half rewritten (callers work on a copy).
func Delta(dir, parent string) (*Stats, error) {
	own, err := pagemaps(dir, anyPagemapRE)
	if err != nil {
		return nil, err
	}
	theirs, err := pagemaps(parent, anyPagemapRE)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(dir, ParentDir)); err == nil {
		return nil, fmt.Errorf("%s already has a parent: it is a delta, not a full dump", dir)
	}
	parentIDs := map[uint32]bool{}
	parentMaps := map[string]*pagemapimg.Image{}
	for _, name := range theirs {
		im, err := readFull(filepath.Join(parent, name))
		if err != nil {
			return nil, err
		}
		parentIDs[im.PagesID] = true
		parentMaps[name] = im
	}
	st := &Stats{}
	next := uint32(deltaIDBase)
	var oldPages []string
	for _, name := range own {
		im, err := readFull(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		for next++; parentIDs[next]; next++ {
		}
		var base *pagemapimg.Image
		if taskPagemapRE.MatchString(name) {
			base = parentMaps[name]
		}
		out, err := deltaOf(dir, parent, name, im, base, next, st)
		if err != nil {
			return nil, err
		}
		oldPages = append(oldPages, pagesPath(dir, im.PagesID))
		if err := replace(filepath.Join(dir, name), out); err != nil {
			return nil, err
		}
		st.Pagemaps++
	}
	for _, p := range oldPages {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	// A pages image left in dir under one of the parent's names would
	// hide the parent's in the union.
	left, err := pagesImages(dir)
	if err != nil {
		return nil, err
	}
	for id, name := range left {
		if parentIDs[id] {
			return nil, fmt.Errorf("%s holds %s, which no pagemap of its names, under a name of its parent's: move it out first (Unreferenced)", dir, name)
		}
	}
	return st, writeParent(dir, parent, parentMaps)
}

// Unreferenced lists the pages images of the images directory dir that none
// of its pagemaps names (a drained capture leaves CRIU's own ones behind).
func Unreferenced(dir string) ([]string, error) {
	all, err := pagesImages(dir)
	if err != nil {
		return nil, err
	}
	maps, err := pagemaps(dir, anyPagemapRE)
	if err != nil {
		return nil, err
	}
	for _, name := range maps {
		im, err := pagemapimg.Read(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		delete(all, im.PagesID)
	}
	var out []string
	for _, name := range all {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

// pagesImages are the pages images of dir, by id.
func pagesImages(dir string) (map[uint32]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[uint32]string{}
	for _, e := range ents {
		if m := pagesRE.FindStringSubmatch(e.Name()); m != nil {
			if id, err := strconv.ParseUint(m[1], 10, 32); err == nil {
				out[uint32(id)] = e.Name()
			}
		}
	}
	return out, nil
}

// deltaOf writes the delta pages image of pagemap name (im) as pages image
// id, and returns its new pagemap; base is the parent's pagemap of the same
// task, or nil.
func deltaOf(dir, parent, name string, im, base *pagemapimg.Image, id uint32, st *Stats) (*pagemapimg.Image, error) {
	cur, err := mapFile(pagesPath(dir, im.PagesID), pagesBytes(im))
	if err != nil {
		return nil, err
	}
	defer unmap(cur)
	var old []byte
	var at *locator
	if base != nil {
		if old, err = mapFile(pagesPath(parent, base.PagesID), pagesBytes(base)); err != nil {
			return nil, err
		}
		defer unmap(old)
		at = newLocator(base)
	}
	f, err := os.OpenFile(pagesPath(dir, id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	out := &pagemapimg.Image{PagesID: id}
	add := func(e pagemapimg.Entry) {
		if n := len(out.Entries); n > 0 {
			last := &out.Entries[n-1]
			if last.Flags == e.Flags && last.End() == e.Vaddr {
				last.Pages += e.Pages
				return
			}
		}
		out.Entries = append(out.Entries, e)
	}
	var off uint64
	for _, e := range im.Entries {
		for p := uint64(0); p < e.Pages; p++ {
			page := cur[off : off+pageSize]
			off += pageSize
			vaddr := e.Vaddr + p*pageSize
			st.Pages++
			if at != nil {
				if o, ok := at.find(vaddr); ok && bytes.Equal(old[o:o+pageSize], page) {
					st.InParent++
					// As CRIU marks a page of its parent's: PE_PARENT
					// alone (its lazy-pages daemon cannot serve a lazy
					// one from a parent).
					add(pagemapimg.Entry{Vaddr: vaddr, Pages: 1, Flags: pagemapimg.InParent})
					continue
				}
			}
			if _, err := w.Write(page); err != nil {
				return nil, err
			}
			add(pagemapimg.Entry{Vaddr: vaddr, Pages: 1, Flags: e.Flags})
		}
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return out, f.Close()
}

// writeParent makes dir/parent: copies of parent's pagemaps, and links to
// the parent's pages images where the union of the two layers has them.
func writeParent(dir, parent string, maps map[string]*pagemapimg.Image) error {
	pdir := filepath.Join(dir, ParentDir)
	if err := os.Mkdir(pdir, 0o700); err != nil {
		return err
	}
	for name, im := range maps {
		data, err := os.ReadFile(filepath.Join(parent, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(pdir, name), data, 0o600); err != nil {
			return err
		}
		pages := pagesName(im.PagesID)
		if err := os.Symlink("../"+pages, filepath.Join(pdir, pages)); err != nil {
			return err
		}
	}
	return nil
}

// CheckParentLink reports whether a link at rel (slash-separated, in a
// checkpoint image's layer, under its images directory images) pointing to
// target is one Delta writes: parent/pages-<id>.img to ../pages-<id>.img.
func CheckParentLink(images, rel, target string) bool {
	name, ok := strings.CutPrefix(rel, images+"/"+ParentDir+"/")
	return ok && pagesRE.MatchString(name) && target == "../"+name
}

// AssembleAll writes into kept the full pages image of each pagemap kept
// there (a task's own, as its dump wrote it), from the pagemap of the same
// name in the delta images directory dir: each page from dir's pages image
// where that pagemap has it present, else from dir/parent, as CRIU's
// restore reads it. The bytes are those of the pages image the dump had
// before Delta. Each of the parent's pages images serves one pagemap at
// most, and each page at most once (pagemapimg.Read refuses overlapping
// entries): what is written is never more than what dir holds, whatever
// an untrusted image's pagemaps say.
func AssembleAll(dir, kept string) error {
	maps, err := pagemaps(kept, anyPagemapRE)
	if err != nil {
		return err
	}
	used := map[uint32]bool{}
	for _, name := range maps {
		orig, err := pagemapimg.Read(filepath.Join(kept, name))
		if err != nil {
			return fmt.Errorf("the dump's own %s: %w", name, err)
		}
		if err := assemble(dir, name, filepath.Join(kept, pagesName(orig.PagesID)), used); err != nil {
			return err
		}
	}
	return nil
}

func assemble(dir, name, out string, used map[uint32]bool) error {
	im, err := pagemapimg.Read(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	var fromParent bool
	for _, e := range im.Entries {
		switch {
		case e.Flags&pagemapimg.Present != 0:
		case e.Flags&pagemapimg.InParent != 0:
			fromParent = true
		default:
			return fmt.Errorf("%s: the pages at %#x are neither present nor in the parent", name, e.Vaddr)
		}
	}
	cur, err := mapFile(pagesPath(dir, im.PagesID), pagesBytes(im))
	if err != nil {
		return err
	}
	defer unmap(cur)
	var old []byte
	var at *locator
	if fromParent {
		pdir := filepath.Join(dir, ParentDir)
		base, err := readFull(filepath.Join(pdir, name))
		if err != nil {
			return fmt.Errorf("its parent: %w", err)
		}
		if used[base.PagesID] {
			return fmt.Errorf("its parent's %s serves another pagemap too", pagesName(base.PagesID))
		}
		used[base.PagesID] = true
		if old, err = mapFile(pagesPath(pdir, base.PagesID), pagesBytes(base)); err != nil {
			return fmt.Errorf("its parent: %w", err)
		}
		defer unmap(old)
		at = newLocator(base)
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	var off uint64
	for _, e := range im.Entries {
		n := e.Pages * pageSize
		if e.Flags&pagemapimg.Present != 0 {
			if _, err := w.Write(cur[off : off+n]); err != nil {
				return err
			}
			off += n
			continue
		}
		for p := uint64(0); p < e.Pages; p++ {
			o, ok := at.find(e.Vaddr + p*pageSize)
			if !ok {
				return fmt.Errorf("%s: the page at %#x is in no parent pagemap", name, e.Vaddr+p*pageSize)
			}
			if _, err := w.Write(old[o : o+pageSize]); err != nil {
				return err
			}
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// Pagemaps lists the pagemap images of dir (tasks' and shared memory's).
func Pagemaps(dir string) ([]string, error) { return pagemaps(dir, anyPagemapRE) }

// locator finds a page of a full pagemap in its pages image.
type locator struct {
	entries []pagemapimg.Entry
	offsets []uint64 // of each entry's first page
}

func newLocator(im *pagemapimg.Image) *locator {
	l := &locator{}
	var off uint64
	for _, e := range im.Entries {
		if e.Flags&pagemapimg.Present == 0 {
			continue
		}
		l.entries = append(l.entries, e)
		l.offsets = append(l.offsets, off)
		off += e.Pages * pageSize
	}
	return l
}

// find returns the offset of the page at vaddr in the pages image.
func (l *locator) find(vaddr uint64) (uint64, bool) {
	i := sort.Search(len(l.entries), func(i int) bool { return l.entries[i].End() > vaddr })
	if i == len(l.entries) || l.entries[i].Vaddr > vaddr {
		return 0, false
	}
	return l.offsets[i] + (vaddr - l.entries[i].Vaddr), true
}

// readFull reads a pagemap whose pages are all in its own pages image.
func readFull(path string) (*pagemapimg.Image, error) {
	im, err := pagemapimg.Read(path)
	if err != nil {
		return nil, err
	}
	for _, e := range im.Entries {
		if e.Flags&pagemapimg.InParent != 0 {
			return nil, fmt.Errorf("%s has pages in a parent dump: it is a delta, not a full dump", path)
		}
		if e.Flags&pagemapimg.Present == 0 {
			return nil, fmt.Errorf("%s has pages at %#x that are not in its pages image", path, e.Vaddr)
		}
	}
	return im, nil
}

func pagesBytes(im *pagemapimg.Image) int64 {
	var n int64
	for _, e := range im.Entries {
		if e.Flags&pagemapimg.Present != 0 {
			n += int64(e.Pages) * pageSize
		}
	}
	return n
}

func pagesName(id uint32) string { return "pages-" + strconv.FormatUint(uint64(id), 10) + ".img" }

func pagesPath(dir string, id uint32) string { return filepath.Join(dir, pagesName(id)) }

func pagemaps(dir string, re *regexp.Regexp) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && re.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// mapFile maps path, which must hold exactly size bytes, read-only.
func mapFile(path string, size int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if size == 0 && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() != size {
		return nil, fmt.Errorf("%s holds %d bytes where its pagemap has %d", path, fi.Size(), size)
	}
	if size == 0 {
		return nil, nil
	}
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
}

func unmap(b []byte) {
	if b != nil {
		unix.Munmap(b)
	}
}

// replace writes im over the pagemap at path.
func replace(path string, im *pagemapimg.Image) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := pagemapimg.Write(tmp, im); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
