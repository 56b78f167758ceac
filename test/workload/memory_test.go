package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

func TestXorshiftGolden(t *testing.T) {
	// Pinned so that a change of the generator, which would change every
	// expected memory hash, is a deliberate one.
	gen := newXorshift64(42)
	// Values computed by an independent implementation of the same
	// splitmix64-seeded xorshift64.
	want := []uint64{0xfb4d394f8eadbd08, 0x5eca1bf6459aa472, 0x68488c8e0042cdba}
	for i, w := range want {
		if got := gen.next(); got != w {
			t.Fatalf("word %d of seed 42 = %#x, want %#x", i, got, w)
		}
	}
}

func TestFillPatternGoldenHash(t *testing.T) {
	buf := make([]byte, 1<<20)
	fillPattern(buf, 42)
	sum := sha256.Sum256(buf)
	const want = "8958ae4177aefc6f017d0c77ae43270bb3a9fb997991d0b753e574ccc0c16b97"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("sha256 of 1 MiB of seed 42 = %s, want %s", got, want)
	}
}

func TestFillPatternDeterministic(t *testing.T) {
	a := make([]byte, 1<<16)
	b := make([]byte, 1<<16)
	fillPattern(a, 42)
	fillPattern(b, 42)
	if !bytes.Equal(a, b) {
		t.Fatal("two fills with the same seed differ")
	}
	fillPattern(b, 43)
	if bytes.Equal(a, b) {
		t.Fatal("fills with seeds 42 and 43 are equal")
	}
	if word := binary.LittleEndian.Uint64(a); word != newXorshift64(42).next() {
		t.Fatalf("first word %#x is not the stream's first word in little endian", word)
	}
}

func TestFillPatternZeroSeed(t *testing.T) {
	b := make([]byte, 4096)
	fillPattern(b, 0)
	if bytes.Count(b, []byte{0}) > len(b)/16 {
		t.Fatal("seed 0 produced a mostly zero pattern")
	}
}

func TestFillContinuesStream(t *testing.T) {
	whole := make([]byte, 3*4096)
	fillPattern(whole, 7)
	chunked := make([]byte, len(whole))
	gen := newXorshift64(7)
	for _, cut := range [][2]int{{0, 8}, {8, 4096}, {4096, 3 * 4096}} {
		gen.fill(chunked[cut[0]:cut[1]])
	}
	if !bytes.Equal(whole, chunked) {
		t.Fatal("filling in chunks differs from filling at once")
	}
}

func TestFillRejectsPartialWord(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("fill of 7 bytes did not panic")
		}
	}()
	newXorshift64(1).fill(make([]byte, 7))
}

func TestVerifyPattern(t *testing.T) {
	const size = 3<<20 + 4096 // more than one verification chunk, not a multiple of it
	buf := make([]byte, size)
	fillPattern(buf, 42)
	if err := verifyPattern(buf, 42, ""); err != nil {
		t.Fatalf("fresh pattern: %v", err)
	}
	if err := verifyPattern(buf, 41, ""); err == nil {
		t.Fatal("verify with the wrong seed passed")
	}
	buf[2<<20+5] ^= 1
	err := verifyPattern(buf, 42, "")
	if err == nil || !strings.Contains(err.Error(), "byte 2097157 ") {
		t.Fatalf("corrupted byte 2097157: got error %v", err)
	}
}

func TestRewriteHead(t *testing.T) {
	buf := make([]byte, 1<<20)
	fillPattern(buf, 42)
	orig := bytes.Clone(buf)
	m := &memRegion{buf: buf, seed: 42}
	before := m.sha256()
	if want := sha256.Sum256(orig); before != hex.EncodeToString(want[:]) {
		t.Fatalf("sha256() = %s, want the sha256 of the buffer", before)
	}

	m.rewriteHead("x")
	if bytes.Equal(buf[:headSize], orig[:headSize]) {
		t.Fatal("the head did not change")
	}
	if !bytes.Equal(buf[headSize:], orig[headSize:]) {
		t.Fatal("bytes past the head changed")
	}
	head := make([]byte, headSize)
	fillPattern(head, tagSeed("x"))
	if !bytes.Equal(buf[:headSize], head) {
		t.Fatal("the head is not the tag's pattern")
	}
	if m.sha256() == before {
		t.Fatal("the hash did not change")
	}
	if err := m.verify(); err != nil {
		t.Fatalf("verify after rewrite: %v", err)
	}
	if err := verifyPattern(buf, 42, ""); err == nil {
		t.Fatal("verify ignoring the head rewrite passed")
	}

	// The same tag again gives the same content: hashes are comparable
	// between a source and a sibling mutated alike.
	again := bytes.Clone(orig)
	(&memRegion{buf: again, seed: 42}).rewriteHead("x")
	if !bytes.Equal(buf, again) {
		t.Fatal("the same mutation gave different content")
	}
}

func TestMemRegionMmap(t *testing.T) {
	m, err := newMemRegion(2, 42)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 2<<20)
	fillPattern(want, 42)
	if sum := sha256.Sum256(want); m.sha256() != hex.EncodeToString(sum[:]) {
		t.Fatal("mapped region differs from the pattern")
	}
	if err := m.verify(); err != nil {
		t.Fatal(err)
	}
	if _, err := newMemRegion(0, 42); err == nil {
		t.Fatal("a 0 MiB region was accepted")
	}
}

func TestValidateTag(t *testing.T) {
	for _, tag := range []string{"x", "initial", "after fork", strings.Repeat("a", pageSize-1)} {
		if err := validateTag(tag); err != nil {
			t.Errorf("validateTag(%.20q): %v", tag, err)
		}
	}
	for _, tag := range []string{"", "a\nb", "a\x00b", strings.Repeat("a", pageSize)} {
		if err := validateTag(tag); err == nil {
			t.Errorf("validateTag(%.20q) accepted it", tag)
		}
	}
}

func TestTagPage(t *testing.T) {
	p, err := newTagPage("initial")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.get(); got != "initial" {
		t.Fatalf("get() = %q, want initial", got)
	}
	if err := p.set("a much longer tag than before"); err != nil {
		t.Fatal(err)
	}
	if err := p.set("short"); err != nil {
		t.Fatal(err)
	}
	if got := p.get(); got != "short" {
		t.Fatalf("get() = %q after a shorter tag, want short", got)
	}
	if err := p.set("bad\ntag"); err == nil {
		t.Fatal("a tag with a newline was accepted")
	}
	if got := p.get(); got != "short" {
		t.Fatalf("a refused tag changed the page to %q", got)
	}
	full := strings.Repeat("z", pageSize-1)
	if err := p.set(full); err != nil {
		t.Fatal(err)
	}
	if got := p.get(); got != full {
		t.Fatal("a page-filling tag did not round-trip")
	}
}
