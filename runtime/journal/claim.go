package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
)

// A record (a journal entry, or a record of the same design elsewhere, such
// as a fork call's) is a file NAME.json in a directory of records, owned by
// the process it names. When its owner is gone, a process claims it by
// renaming it NAME.json.claimed-by-PID-START after itself: when two
// processes recover at once, each record goes to exactly one of them, and
// a claim whose claimer is gone in turn is claimed again.

// ClaimSep separates a record's name from the owner that claimed it.
const ClaimSep = ".claimed-by-"

// Claim is a record claimed by the calling process.
type Claim[R any] struct {
	// Path is where the record is now, under its claimed name.
	Path string
	Rec  R
}

// ClaimOrphans claims, for the calling process, the records in dir whose
// owner (as owner reads it from a record) is gone, as gone judges it; gone
// judges earlier claimers too.
func ClaimOrphans[R any](dir string, owner func(*R) Owner, gone func(Owner) bool) ([]Claim[R], error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	self := Self()
	var out []Claim[R]
	for _, de := range entries {
		base, claimer, claimed := strings.Cut(de.Name(), ClaimSep)
		if !strings.HasSuffix(base, ".json") || (claimed && !gone(parseOwner(claimer))) {
			continue
		}
		path := filepath.Join(dir, de.Name())
		var rec R
		if err := atomicfile.ReadJSON(path, &rec); err != nil || !gone(owner(&rec)) {
			continue
		}
		claim := ClaimedBy(filepath.Join(dir, base), self)
		if err := os.Rename(path, claim); err != nil {
			continue // another process claimed it first
		}
		out = append(out, Claim[R]{Path: claim, Rec: rec})
	}
	return out, nil
}

// ClaimedBy is the path of the record at path once o has claimed it.
func ClaimedBy(path string, o Owner) string {
	return path + ClaimSep + fmt.Sprintf("%d-%d", o.Pid, o.StartTime)
}

// Unclaimed is the path a claimed record had before it was claimed: where
// it goes back for a later claim.
func Unclaimed(path string) string {
	base, _, _ := strings.Cut(filepath.Base(path), ClaimSep)
	return filepath.Join(filepath.Dir(path), base)
}

func parseOwner(s string) Owner {
	var o Owner
	fmt.Sscanf(s, "%d-%d", &o.Pid, &o.StartTime)
	return o
}
