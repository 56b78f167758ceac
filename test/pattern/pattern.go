// Package pattern is the memory contents the lazy-pages tests restore and
// check: a deterministic word sequence and a fast hash over it, shared by the
// program that fills memory and by the tests that predict its hash.
package pattern

import (
	"fmt"
	"math/bits"
)

// Word is the value of the i-th 8-byte word of a filled buffer.
//
//go:nosplit
func Word(i uint64) uint64 {
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Fill writes the pattern into words.
func Fill(words []uint64) {
	for i := range words {
		words[i] = Word(uint64(i))
	}
}

// Seed starts a hash.
const Seed = 0xcbf29ce484222325

// Mix adds one word to a hash. It is order-sensitive, so a page moved to the
// wrong place changes the hash as surely as a page with wrong contents.
//
//go:nosplit
func Mix(h, w uint64) uint64 {
	return bits.RotateLeft64(h^w, 29) * 0x100000001b3
}

// Hash is the hash of words.
func Hash(words []uint64) uint64 {
	h := uint64(Seed)
	for _, w := range words {
		h = Mix(h, w)
	}
	return h
}

// Expected is the hash of n words of the pattern whose first zeroWords words
// were discarded (read back as zero).
func Expected(n, zeroWords uint64) uint64 {
	h := uint64(Seed)
	for i := uint64(0); i < n; i++ {
		w := Word(i)
		if i < zeroWords {
			w = 0
		}
		h = Mix(h, w)
	}
	return h
}

// Format is how hashes are written in answers.
func Format(h uint64) string { return fmt.Sprintf("%016x", h) }
