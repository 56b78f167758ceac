package branch

import (
	"os"
	"testing"

	"github.com/tclone/tclone/runtime/branch/signing"
)

// testKey is a signing key of the test's own.
func testKey(t testing.TB) *signing.Key {
	t.Helper()
	k, err := signing.HostKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// trusting is the options of an import as name that trusts key, with
// check (nil: accept) as its manifest check.
func trusting(key *signing.Key, name string, check func(*Branch) error) ImportOptions {
	trust := &signing.Trust{}
	trust.Add(key.Public(), "the test's key")
	return ImportOptions{Name: name, Trust: trust, Prepare: func(b *Branch) (TreeRules, error) {
		if check != nil {
			return TreeRules{}, check(b)
		}
		return TreeRules{}, nil
	}}
}

var exploitKeyDir string

// signingKeyForTests is one key for the whole test binary.
func signingKeyForTests() (*signing.Key, error) {
	if exploitKeyDir == "" {
		d, err := os.MkdirTemp("", "tclone-test-key-")
		if err != nil {
			return nil, err
		}
		exploitKeyDir = d
	}
	return signing.HostKey(exploitKeyDir)
}
