// Package journal records fork operations in flight, so that whatever a
// killed tclone left half done can be found and undone later. Each operation
// is one small JSON file that names its owner process; an entry whose owner is
// gone belongs to a crash.
package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/procfs"
)

// Kind of operation.
type Kind string

const (
	// Capture is a Phase A in progress: a plan being written, possibly a
	// source frozen.
	Capture Kind = "capture"
	// Materialize is a Phase B in progress: a sibling being built.
	Materialize Kind = "materialize"
)

// Owner identifies a process beyond its PID, which the kernel may reuse.
type Owner struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// Self is the calling process as an Owner.
func Self() Owner {
	pid := os.Getpid()
	o, _ := OwnerOf(pid)
	o.Pid = pid
	return o
}

// Alive reports whether the owner process still exists. A zombie does:
// until its parent reaps it, its PID names no other process.
func (o Owner) Alive() bool {
	st, err := procfs.ReadStat(o.Pid)
	return err == nil && st.StartTime == o.StartTime
}

// Running reports whether the owner process still runs and has not
// exited: unlike Alive, a zombie (a process killed before its parent reaped
// it) is not running, and holds nothing any more.
func (o Owner) Running() bool {
	st, err := procfs.ReadStat(o.Pid)
	return err == nil && st.StartTime == o.StartTime && !st.Exited()
}

// OwnerOf identifies another running process, such as the CRIU a capture
// started. The zero Owner (and false) means it is already gone.
func OwnerOf(pid int) (Owner, bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return Owner{}, false
	}
	return Owner{Pid: pid, StartTime: st.StartTime}, true
}

// Phase is how far an operation got; each kind has its own.
type Phase string

// Capture phases.
const (
	CaptureDump Phase = "dump" // CRIU not started: nothing of the source is held
	// CaptureSeized: CRIU (CaptureRecord.Criu) may hold the source's tree,
	// and may have locked its network or put its connections into repair
	// mode.
	CaptureSeized Phase = "seized"
	CaptureDumped Phase = "dumped" // CRIU let the source go; it runs
	// CaptureFrozen is what captures of older tclone versions recorded
	// before they froze the source's cgroup. Recovery still thaws it.
	CaptureFrozen Phase = "frozen"
)

// Materialisation phases.
const (
	MaterializePrepare Phase = "prepare" // nothing of the sibling made yet
	MaterializeRootfs  Phase = "rootfs"  // the sibling's root may hold files
	MaterializeRestore Phase = "restore" // crun may have made the sibling
)

// Record is one operation in flight: what every kind has, and the record of
// its own kind.
type Record struct {
	Kind    Kind      `json:"kind"`
	Owner   Owner     `json:"owner"`
	Started time.Time `json:"started"`
	Phase   Phase     `json:"phase"`
	// PlanDir is the plan the operation writes (a capture) or reads.
	PlanDir string `json:"plan_dir,omitempty"`
	// CrunRoot lets recovery reach crun the way the operation did.
	CrunRoot string `json:"crun_root,omitempty"`

	Capture     *CaptureRecord     `json:"capture,omitempty"`
	Materialize *MaterializeRecord `json:"materialize,omitempty"`
}

// CaptureRecord is what a capture in flight has touched.
type CaptureRecord struct {
	SourceID string `json:"source_id,omitempty"`
	// SnapshotPath is where a capture puts the root filesystem snapshot,
	// recorded before it is taken (a btrfs snapshot lives next to its
	// subvolume, outside tclone's directories).
	SnapshotKind string `json:"snapshot_kind,omitempty"`
	SnapshotPath string `json:"snapshot_path,omitempty"`
	// FreezerDir is the source's freezer, which captures of older tclone
	// versions froze (phase "frozen"); recovery still thaws what they left.
	FreezerDir string `json:"freezer_dir,omitempty"`
	// Criu is the CRIU process of a capture, recorded before it seizes the
	// source's tree. While it lives it holds the tree; the kernel lets the
	// tree go when it dies.
	Criu *Owner `json:"criu,omitempty"`
	// Source is where the source's processes and network live, for
	// undoing what a CRIU that died left in them.
	Source *SourceRefs `json:"source,omitempty"`
}

// MaterializeRecord is what a materialisation in flight has made.
type MaterializeRecord struct {
	SiblingID string `json:"sibling_id,omitempty"`
	// SiblingCreated is set once the sibling may exist in crun's state.
	SiblingCreated bool `json:"sibling_created,omitempty"`
	// RootTarget is the sibling root Phase B writes into; RootFilled is set
	// once it may hold files.
	RootTarget string `json:"root_target,omitempty"`
	RootFilled bool   `json:"root_filled,omitempty"`
	// VolumesFilled are the sibling's own volume directories the
	// operation may have written into (each was empty before).
	VolumesFilled []string `json:"volumes_filled,omitempty"`
	// OwnsPlan marks a plan made only for this operation, to be removed
	// with it (tclone fork SRC NEW).
	OwnsPlan bool `json:"owns_plan,omitempty"`
	// SiblingCgroup is the sibling's cgroupsPath, to remove if a failed
	// restore left it.
	SiblingCgroup string `json:"sibling_cgroup,omitempty"`
	// ImagesOverlay is a per-sibling image directory to remove.
	ImagesOverlay string `json:"images_overlay,omitempty"`
	// Restorer is the crun restore process, with CRIU below it, while it
	// runs: recovery kills what is left of it.
	Restorer *Owner `json:"restorer,omitempty"`
}

// UnmarshalJSON reads a record, and the flat records of older versions,
// whose fields are those of CaptureRecord and MaterializeRecord.
func (r *Record) UnmarshalJSON(data []byte) error {
	type plain Record
	if err := json.Unmarshal(data, (*plain)(r)); err != nil {
		return err
	}
	switch {
	case r.Kind == Capture && r.Capture == nil:
		r.Capture = &CaptureRecord{}
		return json.Unmarshal(data, r.Capture)
	case r.Kind == Materialize && r.Materialize == nil:
		r.Materialize = &MaterializeRecord{}
		return json.Unmarshal(data, r.Materialize)
	}
	return nil
}

// SourceRefs locate what a capture's CRIU changes in the source besides its
// tasks: the network namespace it may lock, and the sockets it may put into
// TCP repair mode.
type SourceRefs struct {
	// NetNS is the source's network namespace (a path), and NetNSInode
	// its inode, so that a path reused by another namespace is not touched.
	NetNS      string `json:"net_ns,omitempty"`
	NetNSInode uint64 `json:"net_ns_inode,omitempty"`
	// CgroupDir is a directory of the source's cgroup; its cgroup.procs
	// lists the source's processes.
	CgroupDir string `json:"cgroup_dir,omitempty"`
	// NetworkLocked is set when CRIU announced it locks the namespace's
	// network (iptables or nftables rules that drop every packet but its
	// own), before it does.
	NetworkLocked bool `json:"network_locked,omitempty"`
	// TCPRepair is set when the capture dumps established TCP connections,
	// which CRIU puts into repair mode (they send nothing) while it dumps.
	TCPRepair bool `json:"tcp_repair,omitempty"`
}

// PhaseCommitted marks an operation that older tclone versions recorded as
// finished and reported done: recovery removes its entry and undoes
// nothing. This version ends an entry only when the operation is reported
// (the process is about to exit 0), so an entry it leaves is unfinished.
const PhaseCommitted Phase = "committed"

// Journal is a directory of records.
type Journal struct{ Dir string }

// Entry is a record that is in the journal.
type Entry struct {
	path string
	Rec  Record
}

// Begin writes a new record owned by the calling process.
func (j Journal) Begin(rec Record) (*Entry, error) {
	if err := os.MkdirAll(j.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating journal %s: %w", j.Dir, err)
	}
	rec.Owner = Self()
	rec.Started = time.Now().UTC()
	name := fmt.Sprintf("%s-%d-%d.json", rec.Kind, rec.Owner.Pid, rec.Started.UnixNano())
	e := &Entry{path: filepath.Join(j.Dir, name), Rec: rec}
	// Save writes a temporary file and renames it, so a reader never sees
	// a half-written entry.
	return e, e.Save()
}

// Save writes the entry's current record.
func (e *Entry) Save() error {
	if err := atomicfile.WriteJSON(e.path, e.Rec, 0o600); err != nil {
		return fmt.Errorf("writing journal entry: %w", err)
	}
	return nil
}

// Update changes the record and saves it before returning, so the change is
// on record before the step it announces begins.
func (e *Entry) Update(fn func(*Record)) error {
	fn(&e.Rec)
	return e.Save()
}

// End removes the entry: the operation finished, well or badly, and left
// nothing to recover.
func (e *Entry) End() error {
	if e == nil {
		return nil
	}
	err := os.Remove(e.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Unclaim gives back an orphan this process claimed but could not finish,
// so that the next recovery (the next fork, or tclone gc) tries again.
func (e *Entry) Unclaim() error {
	orig := Unclaimed(e.path)
	if orig == e.path {
		return nil
	}
	if err := os.Rename(e.path, orig); err != nil {
		return fmt.Errorf("returning journal entry %s for a later recovery: %w", orig, err)
	}
	e.path = orig
	return nil
}

// Orphans claims and returns the entries whose owner is no longer running
// (see ClaimOrphans).
func (j Journal) Orphans() ([]*Entry, error) {
	j.removeStaleTemps()
	claims, err := ClaimOrphans(j.Dir, func(r *Record) Owner { return r.Owner }, func(o Owner) bool { return !o.Alive() })
	var out []*Entry
	for _, c := range claims {
		out = append(out, &Entry{path: c.Path, Rec: c.Rec})
	}
	return out, err
}

// staleTemp is how old a temporary file of an entry's update must be to be
// one its writer left when it was killed mid-write: an update takes
// microseconds.
const staleTemp = 10 * time.Second

// removeStaleTemps removes the temporary files of entry updates whose
// writer was killed between writing and renaming them: at once when the
// entry's owner, named in it, is gone (under its own name an entry is
// written by its owner alone; a claimed one has another name), else once
// stale.
func (j Journal) removeStaleTemps() {
	temps, _ := filepath.Glob(filepath.Join(j.Dir, "*.json.tmp*"))
	for _, path := range temps {
		st, err := os.Stat(path)
		if err != nil {
			continue
		}
		age := time.Since(st.ModTime())
		if age > staleTemp || !ownerNamedIn(filepath.Base(path)).Running() {
			os.Remove(path)
		}
	}
}

// ownerNamedIn is the owner an entry's name gives (KIND-PID-NANOS.json),
// with its current start time: Running is false when no such process runs.
func ownerNamedIn(name string) Owner {
	f := strings.SplitN(name, "-", 3)
	if len(f) < 3 {
		return Owner{}
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return Owner{}
	}
	o, _ := OwnerOf(pid)
	return o
}

// CaptureRec is the capture's record; never nil, so that a damaged entry
// reads as one that touched nothing.
func (r Record) CaptureRec() *CaptureRecord {
	if r.Capture == nil {
		return &CaptureRecord{}
	}
	return r.Capture
}

// MaterializeRec is the materialisation's record; never nil, so that a
// damaged entry reads as one that made nothing.
func (r Record) MaterializeRec() *MaterializeRecord {
	if r.Materialize == nil {
		return &MaterializeRecord{}
	}
	return r.Materialize
}
