package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The big memory region is filled from a PRNG rather than left zero so that
// every page is private, dirty and different: a fork that drops, shares or
// misplaces a page changes the hash, and zero-page tricks cannot hide it.

// headSize is the part of the region a mutation rewrites: one page, so a
// mutation dirties exactly one page of the region.
const headSize = 4096

// pageSize is the size of the tag page. Linux on every architecture tclone
// supports uses at least 4 KiB pages.
const pageSize = 4096

// xorshift64 is Marsaglia's xorshift64 generator: a few shifts per 8 bytes,
// so filling hundreds of MiB costs far less than the page faults it causes.
type xorshift64 struct{ state uint64 }

// newXorshift64 seeds the generator. The seed goes through a splitmix64 step
// first: raw xorshift from a small seed such as 42 would start with many
// near-zero words, and a zero state would stay zero for ever.
func newXorshift64(seed uint64) *xorshift64 {
	z := seed + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	if z == 0 {
		z = 0x9e3779b97f4a7c15
	}
	return &xorshift64{state: z}
}

func (x *xorshift64) next() uint64 {
	s := x.state
	s ^= s << 13
	s ^= s >> 7
	s ^= s << 17
	x.state = s
	return s
}

// fill writes the next len(b)/8 words of the stream into b, little endian,
// so the content does not depend on the host's byte order. len(b) must be a
// multiple of 8; successive calls continue the same stream.
func (x *xorshift64) fill(b []byte) {
	if len(b)%8 != 0 {
		panic(fmt.Sprintf("xorshift64.fill: length %d is not a multiple of 8", len(b)))
	}
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:i+8], x.next())
	}
}

// fillPattern fills b with the stream of seed.
func fillPattern(b []byte, seed uint64) {
	newXorshift64(seed).fill(b)
}

// tagSeed derives the seed of the head pattern a mutation writes, so the
// head content is a function of the tag alone.
func tagSeed(tag string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(tag))
	return h.Sum64()
}

// validateTag checks a tag before it is stored in the tag page (which holds
// it NUL-terminated) and appended as one line to mutations.log.
func validateTag(tag string) error {
	switch {
	case tag == "":
		return errors.New("tag is empty")
	case len(tag) > pageSize-1:
		return fmt.Errorf("tag is %d bytes; at most %d fit in the tag page", len(tag), pageSize-1)
	case strings.ContainsAny(tag, "\x00\n"):
		return errors.New("tag contains a NUL or newline")
	}
	return nil
}

// memRegion is the big anonymous private mapping.
type memRegion struct {
	mu   sync.RWMutex // writers: head rewrites; readers: hashing, verifying
	buf  []byte
	seed uint64
	// headTag is the tag whose pattern the first headSize bytes hold, or ""
	// while they still hold the seed's stream. Together with seed it says
	// exactly what the region must contain, which verify checks.
	headTag string
}

// newMemRegion maps mib MiB of anonymous private memory and fills it.
func newMemRegion(mib int, seed uint64) (*memRegion, error) {
	if mib < 1 {
		return nil, fmt.Errorf("memory region must be at least 1 MiB, got %d", mib)
	}
	buf, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d MiB: %w", mib, err)
	}
	fillPattern(buf, seed)
	return &memRegion{buf: buf, seed: seed}, nil
}

// rewriteHead overwrites the first page with the pattern of tag.
func (m *memRegion) rewriteHead(tag string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fillPattern(m.buf[:min(headSize, len(m.buf))], tagSeed(tag))
	m.headTag = tag
}

// sha256 hashes the whole region as it is now.
func (m *memRegion) sha256() string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	sum := sha256.Sum256(m.buf)
	return hex.EncodeToString(sum[:])
}

// verify compares the region with the content it must have (the seed's
// stream, with the head replaced by the last mutation's pattern) and
// reports the first differing byte.
func (m *memRegion) verify() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return verifyPattern(m.buf, m.seed, m.headTag)
}

// verifyPattern is verify on a plain buffer. It regenerates the expected
// stream in chunks so it needs no second copy of the region.
func verifyPattern(buf []byte, seed uint64, headTag string) error {
	const chunk = 1 << 20
	gen := newXorshift64(seed)
	want := make([]byte, chunk)
	for off := 0; off < len(buf); off += chunk {
		n := min(chunk, len(buf)-off)
		gen.fill(want[:n])
		if off == 0 && headTag != "" {
			fillPattern(want[:min(headSize, n)], tagSeed(headTag))
		}
		if got := buf[off : off+n]; !bytes.Equal(got, want[:n]) {
			for i := range got {
				if got[i] != want[i] {
					return fmt.Errorf("memory differs from the expected pattern at byte %d (0x%x): got 0x%02x, want 0x%02x",
						off+i, off+i, got[i], want[i])
				}
			}
		}
	}
	return nil
}

// tagPage is a separate page holding a NUL-terminated string, changed by
// mutations, so a test can tell which side of a fork saw which mutation.
type tagPage struct {
	mu   sync.Mutex
	page []byte
}

func newTagPage(initial string) (*tagPage, error) {
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap tag page: %w", err)
	}
	t := &tagPage{page: page}
	if err := t.set(initial); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *tagPage) set(tag string) error {
	if err := validateTag(tag); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := copy(t.page, tag)
	clear(t.page[n:])
	return nil
}

func (t *tagPage) get() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := bytes.IndexByte(t.page, 0); i >= 0 {
		return string(t.page[:i])
	}
	return string(t.page)
}
