// Package pagemapimg reads and writes CRIU's pagemap images
// (pagemap-<id>.img, pagemap-shmem-<id>.img): a head naming the pages image
// (pages-<pages_id>.img) that holds the present pages, then one entry per
// run of pages, in address order.
package pagemapimg

import (
	"fmt"
	"os"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Entry flags (criu/include/pagemap.h).
const (
	InParent = 1 << 0 // PE_PARENT: the pages are in the parent images directory's dump
	Lazy     = 1 << 1 // PE_LAZY: restore --lazy-pages leaves them to the daemon
	Present  = 1 << 2 // PE_PRESENT: the pages are in this dump's pages image
)

// PageSize is the size of the pages a pagemap counts.
const PageSize = 4096

// maxAddr bounds the addresses a pagemap may describe (57-bit virtual
// addresses, x86-64's widest), so that no count read from an image
// overflows.
const maxAddr = 1 << 57

// maxImageBytes bounds a pagemap image's file (some 20 bytes an entry).
const maxImageBytes = 256 << 20

// NrPagesField is pagemap_entry.nr_pages, the 64-bit page count CRIU 4.x
// writes instead of the old 32-bit field 2 (compat_nr_pages), which it
// leaves 0. go-criu v7 only knows field 2, so field 5 is read from, and
// written to, the message's unknown fields.
const NrPagesField = 5

// Entry is one pagemap entry with its page count and flags resolved the way
// CRIU's init_compat_pagemap_entry does.
type Entry struct {
	Vaddr, Pages uint64
	Flags        uint32
}

// End is the address after the entry's last page.
func (e Entry) End() uint64 { return e.Vaddr + e.Pages*PageSize }

// Image is a decoded pagemap image.
type Image struct {
	PagesID uint32
	Entries []Entry
}

// Read decodes the pagemap image at path.
func Read(path string) (*Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if fi.Size() > maxImageBytes {
		return nil, fmt.Errorf("%s holds %d bytes: no pagemap is that large", path, fi.Size())
	}
	img, err := crit.New(f, nil, "", false, false).Decode(&pagemap.PagemapEntry{})
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if len(img.Entries) == 0 {
		return nil, fmt.Errorf("%s has no pagemap head", path)
	}
	head, ok := img.Entries[0].Message.(*pagemap.PagemapHead)
	if !ok {
		return nil, fmt.Errorf("%s does not start with a pagemap head", path)
	}
	out := &Image{PagesID: head.GetPagesId()}
	for _, e := range img.Entries[1:] {
		pe, ok := e.Message.(*pagemap.PagemapEntry)
		if !ok {
			return nil, fmt.Errorf("%s holds a %T where a pagemap entry belongs", path, e.Message)
		}
		entry, err := Resolve(pe)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if entry.Vaddr > maxAddr || entry.Pages > (maxAddr-entry.Vaddr)/PageSize {
			return nil, fmt.Errorf("%s: an entry of %d pages at %#x leaves the address space", path, entry.Pages, entry.Vaddr)
		}
		if entry.Vaddr%PageSize != 0 {
			return nil, fmt.Errorf("%s: an entry at %#x is not page-aligned", path, entry.Vaddr)
		}
		// CRIU writes entries in address order, apart: so are the
		// offsets of their pages in the pages image, and no image
		// names a page twice.
		if n := len(out.Entries); n > 0 && entry.Vaddr < out.Entries[n-1].End() {
			return nil, fmt.Errorf("%s: the entry at %#x overlaps or precedes the one before it, at %#x", path, entry.Vaddr, out.Entries[n-1].Vaddr)
		}
		out.Entries = append(out.Entries, entry)
	}
	return out, nil
}

// Resolve reads one entry as CRIU does: in_parent is the old spelling of
// PE_PARENT, an entry without flags is present, and the page count is field
// 5 where CRIU 4.x wrote it.
func Resolve(pe *pagemap.PagemapEntry) (Entry, error) {
	e := Entry{Vaddr: pe.GetVaddr(), Pages: uint64(pe.GetNrPages()), Flags: pe.GetFlags()}
	switch {
	case pe.GetInParent():
		e.Flags |= InParent
	case pe.Flags == nil:
		e.Flags = Present
	}
	n, found, err := unknownVarint(pe, NrPagesField)
	if err != nil {
		return e, fmt.Errorf("entry at %#x: %w", e.Vaddr, err)
	}
	if found {
		e.Pages = n
	}
	return e, nil
}

// Message is e as CRIU 4.x writes it.
func Message(e Entry) *pagemap.PagemapEntry {
	pe := &pagemap.PagemapEntry{Vaddr: proto.Uint64(e.Vaddr), NrPages: proto.Uint32(0), Flags: proto.Uint32(e.Flags)}
	b := protowire.AppendTag(nil, NrPagesField, protowire.VarintType)
	pe.ProtoReflect().SetUnknown(protowire.AppendVarint(b, e.Pages))
	return pe
}

// Write writes a pagemap image of pagesID and entries to path, which must
// not exist.
func Write(path string, im *Image) error {
	img := &crit.CriuImage{Magic: "PAGEMAP"}
	img.Entries = append(img.Entries, &crit.CriuEntry{Message: &pagemap.PagemapHead{PagesId: proto.Uint32(im.PagesID)}})
	for _, e := range im.Entries {
		img.Entries = append(img.Entries, &crit.CriuEntry{Message: Message(e)})
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// unknownVarint finds a varint field that m's generated type does not
// declare.
func unknownVarint(m proto.Message, field protowire.Number) (uint64, bool, error) {
	b := m.ProtoReflect().GetUnknown()
	var val uint64
	found := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false, protowire.ParseError(n)
		}
		b = b[n:]
		if num == field && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false, protowire.ParseError(n)
			}
			val, found, b = v, true, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return val, found, nil
}
