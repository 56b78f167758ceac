package pattern

import "testing"

func TestExpectedMatchesHashOfFilledWords(t *testing.T) {
	words := make([]uint64, 4096)
	Fill(words)
	if Hash(words) != Expected(4096, 0) {
		t.Fatal("Expected(n, 0) differs from Hash of a filled buffer")
	}
	for i := range 512 {
		words[i] = 0
	}
	if Hash(words) != Expected(4096, 512) {
		t.Fatal("Expected with discarded words differs from Hash")
	}
	words[1000], words[1001] = words[1001], words[1000]
	if Hash(words) == Expected(4096, 512) {
		t.Fatal("swapping two words did not change the hash")
	}
}
