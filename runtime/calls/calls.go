// Package calls records `podman container fork` calls in progress, so that
// the work of a client that died (kill -9, OOM, a lost terminal) is rolled
// back without it: the siblings it made, the one a restore was making when it
// died, its capture and its temporary directories.
//
// Each call is one small JSON file under <store root>/calls, named after its
// owner process, and updated before each step it announces. A call whose
// owner is gone belongs to a dead client. Collect rolls such calls back; the
// fork client runs it before every fork and `tclone gc` runs it on demand.
//
// Rollback only ever removes containers this call made: those whose IDs it
// recorded, and those carrying LabelCall=<its nonce>, a label each call puts
// into its own checkpoint archives. Never anything found by name.
package calls

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// LabelCall is the label every container made by a fork call carries: the
// call's nonce. It is how a rollback finds a container whose restore failed
// or was cut short before Podman told the client its ID.
const LabelCall = "io.tclone.fork-call"

// FormatVersion is the record layout this build reads and writes.
const FormatVersion = 1

// Record is one fork call in progress.
type Record struct {
	Version int           `json:"version"`
	Owner   journal.Owner `json:"owner"`
	Started time.Time     `json:"started"`
	// Nonce is the value of LabelCall on the call's containers.
	Nonce    string `json:"nonce"`
	SourceID string `json:"source_id,omitempty"`
	// IntentNonce is the nonce of the fork intent the call left for tclone.
	IntentNonce string `json:"intent_nonce,omitempty"`
	// PlanDir is the call's capture, once the client learned it.
	PlanDir string `json:"plan_dir,omitempty"`
	// Siblings are the IDs of the containers the call made.
	Siblings []string `json:"siblings,omitempty"`
	// TempDirs are the client's own temporary directories.
	TempDirs []string `json:"temp_dirs,omitempty"`
	// CRI is the CRI endpoint a Kubernetes fork (tclone kube fork) made
	// its pods through: its Siblings and labelled containers are pods
	// there, not Podman containers. Empty for Podman's forks.
	CRI string `json:"cri,omitempty"`
	// RolledBack is when a collector undid the call. The record is kept
	// for Linger afterwards, because a Podman service may still create a
	// container for a request the dead client sent just before it died.
	RolledBack time.Time `json:"rolled_back,omitzero"`
}

// Linger is how long a rolled-back call's nonce is still swept for.
const Linger = 5 * time.Minute

// Dir is a directory of call records.
type Dir struct{ Path string }

// DirOf is where the calls of store's host are recorded.
func DirOf(store plan.Store) Dir { return Dir{Path: store.CallsDir()} }

// Call is a record on disk, owned by this process.
type Call struct {
	mu   sync.Mutex
	path string
	rec  Record
}

// NewNonce returns a random nonce for a call.
func NewNonce() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Begin records a new call owned by the calling process. The record's
// Owner, Started and Version are filled in; Nonce too when empty.
func (d Dir) Begin(rec Record) (*Call, error) {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return nil, fmt.Errorf("creating the fork call directory %s: %w", d.Path, err)
	}
	rec.Version = FormatVersion
	rec.Owner = journal.Self()
	rec.Started = time.Now().UTC()
	if rec.Nonce == "" {
		rec.Nonce = NewNonce()
	}
	// One process may run several calls at once (a Go program forking in
	// goroutines), so the nonce is part of the name.
	name := fmt.Sprintf("%d-%d-%s.json", rec.Owner.Pid, rec.Owner.StartTime, rec.Nonce)
	c := &Call{path: filepath.Join(d.Path, name), rec: rec}
	return c, c.save()
}

// Record returns a copy of the call's current record.
func (c *Call) Record() Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.rec
	r.Siblings = append([]string(nil), c.rec.Siblings...)
	r.TempDirs = append([]string(nil), c.rec.TempDirs...)
	return r
}

// Update changes the record and writes it before returning, so the change
// is on record before the step it announces begins.
func (c *Call) Update(fn func(*Record)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(&c.rec)
	return c.save()
}

func (c *Call) save() error {
	if err := atomicfile.WriteJSON(c.path, c.rec, 0o600); err != nil {
		return fmt.Errorf("recording the fork call: %w", err)
	}
	return nil
}

// End removes the record: the call finished and left nothing to undo.
func (c *Call) End() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := os.Remove(c.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// claimDead claims and returns the records whose owner is gone, a zombie
// included (journal.ClaimOrphans): two collectors never undo the same call
// at once, and a claim whose collector died is claimed again.
func (d Dir) claimDead() ([]*Call, error) {
	claims, err := journal.ClaimOrphans(d.Path, func(r *Record) journal.Owner { return r.Owner }, func(o journal.Owner) bool { return !o.Running() })
	if err != nil {
		return nil, fmt.Errorf("reading fork calls in %s: %w", d.Path, err)
	}
	var out []*Call
	for _, c := range claims {
		out = append(out, &Call{path: c.Path, rec: c.Rec})
	}
	return out, nil
}

// release gives a claimed record back under its own name, for the next
// collector: a rollback that failed, or a tombstone still lingering.
func (c *Call) release() error {
	dst := journal.Unclaimed(c.path)
	if err := c.save(); err != nil {
		return err
	}
	if err := os.Rename(c.path, dst); err != nil {
		return err
	}
	c.path = dst
	return nil
}
