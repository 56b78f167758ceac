// Package plan defines the fork plan: what a capture (Phase A) leaves for
// materialisation (Phase B), where it is kept, and how long it lives.
//
// A plan is a directory in the plan store, which is always tmpfs so that page
// images never touch a disk:
//
//	<store>/plans/<id>/plan.json   this file's Plan, versioned
//	<store>/plans/<id>/images/     CRIU's images (pages included)
//	<store>/plans/<id>/work/       CRIU's dump log
//	<store>/plans/<id>/uses        remaining materialisations
//	<store>/plans/<id>/lock        serialises use counting
//
// The root filesystem capture lives outside the store (see rootfs), because
// it belongs on the disk the container's storage uses.
package plan

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/rootfs"
)

// FormatVersion is the plan.json layout version this build reads and writes.
const FormatVersion = 1

// Plan is plan.json.
type Plan struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when an unused plan may be collected.
	ExpiresAt time.Time `json:"expires_at"`

	Source Source           `json:"source"`
	Tree   Tree             `json:"tree"`
	Rootfs *rootfs.Snapshot `json:"rootfs"`
	// FilesOnly is a capture of files without processes: no CRIU images;
	// a sibling runs its command from the start.
	FilesOnly bool `json:"files_only,omitempty"`
	// Volumes are the copies of the source's volumes taken at the fork
	// instant (forkopts.Fork.Volumes), each to be copied into the
	// sibling's own directory mounted at the same place.
	Volumes []Volume `json:"volumes,omitempty"`
	// Capture is what the dump asked of CRIU; a restore must match.
	Capture forkopts.Dumped `json:"capture"`
	// Identity says how siblings differ from the source: "unique" gives
	// each its own hostname and machine-id, "preserve" keeps the source's.
	Identity forkopts.Identity `json:"identity"`
	// Memory is how the siblings get the source's memory ("": lazy where
	// the host can).
	Memory forkopts.Memory `json:"memory,omitempty"`
	// Snapshots describe a copy-on-write plan's memory (Memory cow).
	Snapshots *Snapshots `json:"snapshots,omitempty"`
	// TCP is what every sibling does with its copies of the source's
	// established TCP connections. It is a restore option, but Podman's
	// restore call cannot carry it, so the plan does.
	TCP     forkopts.TCPPolicy `json:"tcp_policy"`
	Timings Timings            `json:"timings"`
	Pages   PageStats          `json:"pages"`
	Criu    string             `json:"criu_version"`
}

// Snapshots are a copy-on-write plan's memory: a vma_cherrypick snapshot
// of each of its processes, taken while CRIU held the tree, and held by the
// plan's lazy-pages daemon until the plan is gone or expired.
type Snapshots struct {
	// Processes is how many snapshots there are (processes without
	// memory of their own, zombies, have none).
	Processes int `json:"processes"`
	// AnonPages and SwapEntries are the pages they held when taken,
	// resident and swapped out: what they keep from being freed while the
	// source rewrites them.
	AnonPages   uint64 `json:"anon_pages"`
	SwapEntries uint64 `json:"swap_entries"`
	// TookMs is what taking them added to the source's pause: finding the
	// tree's processes in /proc and the snapshots themselves.
	TookMs float64 `json:"took_ms"`
	// HolderPid is the daemon that holds them.
	HolderPid int `json:"holder_pid"`
	// Twins is how many of them are twins (a twin capture) rather than
	// vma_cherrypick snapshots.
	Twins int `json:"twins,omitempty"`
}

// CheckMemory refuses a plan whose memory record contradicts itself: a
// copy-on-write plan records the snapshots its daemon holds, and only such a
// plan records any.
func (p *Plan) CheckMemory() error {
	held := p.Memory.Held()
	switch {
	case held && p.Snapshots == nil:
		return fmt.Errorf("plan %s says copy-on-write (%s) but records no snapshots: it is damaged; fork the source again", p.ID, p.Memory)
	case !held && p.Snapshots != nil:
		return fmt.Errorf("plan %s records snapshots but its memory is %q, not cow or twin: it is damaged; fork the source again", p.ID, p.Memory)
	case p.Memory == forkopts.MemoryTwin && p.Snapshots.Twins != p.Snapshots.Processes:
		return fmt.Errorf("plan %s says twin but holds %d twins for %d processes: it is damaged; fork the source again", p.ID, p.Snapshots.Twins, p.Snapshots.Processes)
	}
	return nil
}

// Volume is a volume's copy in a plan.
type Volume struct {
	forkopts.Volume
	// Snapshot is the directory holding the copy (Store.VolumesDir).
	Snapshot string       `json:"snapshot"`
	Stats    rootfs.Stats `json:"stats"`
	// CopyMs is how long the copy took, in the source's pause.
	CopyMs float64 `json:"copy_ms"`
}

// Source is what the plan remembers of the container it was captured from.
type Source struct {
	ID         string `json:"id"`
	Bundle     string `json:"bundle"`
	Rootfs     string `json:"rootfs"`
	Pid        int    `json:"pid"`
	CgroupPath string `json:"cgroup_path"`
	Hostname   string `json:"hostname,omitempty"`
	// NetNSPath is set when the source joined a network namespace by path;
	// its sibling then needs one too.
	NetNSPath string `json:"netns_path,omitempty"`
	// NetNSInode identifies the source's network namespace: only a sibling
	// in that very namespace may keep the source's TCP connections.
	NetNSInode uint64 `json:"netns_inode,omitempty"`
	// CrunRoot is the state root crun ran the source under (its caller's
	// --root; "" is crun's default), where the siblings its caller makes
	// are found too.
	CrunRoot string `json:"crun_root,omitempty"`
}

// Tree summarises the captured process tree.
type Tree struct {
	Processes int       `json:"processes"`
	Threads   int       `json:"threads"`
	Tasks     []Process `json:"tasks"`
}

// Process is one captured process, with its namespace-local IDs.
type Process struct {
	Pid     int    `json:"pid"`
	PPid    int    `json:"ppid"`
	Pgid    int    `json:"pgid"`
	Sid     int    `json:"sid"`
	Threads int    `json:"threads"`
	Comm    string `json:"comm,omitempty"`
}

// Timings of the capture, in milliseconds.
type Timings struct {
	TotalMs float64 `json:"total_ms"`
	// FreezeMs is how long CRIU took to seize the tree with ptrace (its
	// freezing time; no cgroup is frozen), or a files-only capture its
	// own seizing.
	FreezeMs float64 `json:"freeze_ms"`
	// DumpMs is CRIU's time with the tree seized, excluding the root
	// filesystem snapshot.
	DumpMs     float64 `json:"dump_ms"`
	SnapshotMs float64 `json:"fs_snapshot_ms"`
	// ThawMs is from the end of the snapshot until CRIU returned, having
	// let the tree go.
	ThawMs float64 `json:"thaw_ms"`
	// SourcePauseMs is the whole time the source could not run: from
	// CRIU's pre-dump notification (just before it seizes) to its return,
	// the sum of the four above.
	SourcePauseMs float64 `json:"source_pause_ms"`
	// CriuFrozenMs is CRIU's own frozen-time figure from its stats.
	CriuFrozenMs float64 `json:"criu_frozen_ms"`
}

// PageStats counts the memory the capture wrote.
type PageStats struct {
	PagesWritten uint64 `json:"pages_written"`
	PagesSkipped uint64 `json:"pages_skipped_parent"`
	BytesWritten int64  `json:"bytes_written"`
}

// NewID returns a fresh plan ID.
func NewID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// ErrNotFound reports a plan that is not in the store.
var ErrNotFound = errors.New("fork plan not found")

// Read loads plan.json from a plan directory.
func Read(dir string) (*Plan, error) {
	var p Plan
	err := atomicfile.ReadJSON(filepath.Join(dir, "plan.json"), &p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s (it was used up, expired or never completed; capture a new one)", ErrNotFound, dir)
	}
	if err != nil {
		return nil, err
	}
	if p.Version != FormatVersion {
		return nil, fmt.Errorf("%s/plan.json has format version %d; this tclone reads version %d (capture it again with this tclone)", dir, p.Version, FormatVersion)
	}
	return &p, nil
}

// Write stores plan.json atomically in dir.
func (p *Plan) Write(dir string) error {
	return atomicfile.WriteJSON(filepath.Join(dir, "plan.json"), p, 0o600)
}
