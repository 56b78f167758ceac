package podmanfork

import (
	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/plan"
)

// Result describes one sibling.
type Result struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Hostname string `json:"hostname"`
	IP       string `json:"ip,omitempty"`
	// RestoreStartMs runs from the start of the fork request until Podman's
	// restore call for this sibling began; RestoreMs is that call. Siblings
	// restored at once (--parallel) have overlapping calls.
	RestoreStartMs float64 `json:"restore_start_ms"`
	RestoreMs      float64 `json:"restore_ms"`
	// HookMs is the time the hooks took; ReadyMs the readiness check
	// after the sibling ran.
	HookMs  float64 `json:"hook_ms"`
	ReadyMs float64 `json:"ready_ms"`
	// RunningMs runs from the start of the fork request until Podman and
	// crun both said this sibling runs.
	RunningMs float64 `json:"running_ms"`
	// FirstCommandMs runs from the start of the fork request to the first
	// command that succeeded in this sibling (a hook, or --ready exec): the
	// latency a user of exec feels. Absent when no command ran.
	FirstCommandMs float64 `json:"first_command_ms,omitempty"`
	// MemoryCompleteMs runs from the start of the fork request until the
	// sibling had all of its memory (a lazy sibling runs before); set
	// with Options.WaitMemory.
	MemoryCompleteMs float64 `json:"memory_complete_ms,omitempty"`
	// Identity says what the sibling has of its own.
	Identity IdentityReport `json:"identity"`
	// Volumes says what it got of each of the source's mounts.
	Volumes []VolumeUse `json:"volumes,omitempty"`
}

// Stats describes the whole call.
type Stats struct {
	Source string `json:"source"`
	// Call is this call's nonce, the value of the label io.tclone.fork-call
	// on each sibling.
	Call         string  `json:"call"`
	CheckpointMs float64 `json:"checkpoint_ms"`
	// SourcePauseMs is how long the source could not run.
	SourcePauseMs float64   `json:"source_pause_ms"`
	Capture       plan.Plan `json:"capture"`
	// Branch is the branch the siblings started from (podman container
	// branch start); CheckpointMs is then the time its plan took.
	Branch   string    `json:"branch,omitempty"`
	TotalMs  float64   `json:"total_ms"`
	Siblings []*Result `json:"siblings"`
}

// What a sibling's identity part is, in IdentityReport.
const (
	IdentityOwn  = "own"  // the sibling has its own
	IdentityKept = "kept" // the sibling has the source's
	IdentityNone = "none" // the image has none (no /etc/machine-id)
)

// IdentityReport says what makes a sibling a different machine from its
// source, as found in the running sibling.
type IdentityReport struct {
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id"`
	// Kept says why a part the policy would change was kept (best-effort).
	Kept []string `json:"kept,omitempty"`
}

// LabelBranch names the label siblings started from a branch carry: the
// branch's ID. A branch taken of such a sibling records it as its parent.
const LabelBranch = "io.tclone.branch"

// BranchOptions configure a branch's creation.
type BranchOptions struct {
	// Labels of the branch, KEY=VALUE.
	Labels Labels `flag:"label" alias:"l" usage:"label the branch KEY=VALUE (io.tclone.keep=true: never pruned)"`
	// VolumeModes is what siblings started from the branch get of the
	// source's named volumes; by default the branch keeps a copy of each,
	// as it was at the capture.
	VolumeModes VolumeModes `flag:"volume-mode" group:"volumes" usage:"what containers started from the branch get of the source's named volumes: copy (default: the branch keeps a copy, and each container gets its own), share (the source's own), or NAME=copy|share for one volume"`
	// FileLocks captures the source's file locks.
	FileLocks bool `flag:"file-locks" usage:"capture file locks"`
}

// Validate checks the options, as a branch's creation would before doing
// anything.
func (o BranchOptions) Validate() error { return checkBranchLabels(o.Labels) }

// BranchStats describes a branch's creation.
type BranchStats struct {
	Branch *branch.Branch `json:"branch"`
	Call   string         `json:"call"`
	// CheckpointMs is the capture, of which the source could not run for
	// SourcePauseMs; DurableMs runs from the request until the branch was
	// on disk.
	CheckpointMs  float64 `json:"checkpoint_ms"`
	SourcePauseMs float64 `json:"source_pause_ms"`
	WriteMs       float64 `json:"write_ms"`
	DurableMs     float64 `json:"durable_ms"`
	// CopiedBytes is the memory a twin capture copied out of its twins
	// after the source ran on; FromBaseBytes, what it took from the last
	// branch instead (pages the source did not write since: incremental
	// branches).
	CopiedBytes   int64 `json:"copied_bytes,omitempty"`
	FromBaseBytes int64 `json:"from_base_bytes,omitempty"`
}

// ImportOptions configure an import.
type ImportOptions struct {
	// Name is the branch's name here (its own when empty).
	Name string `flag:"name" usage:"the branch's name here (default: its own)"`
	// Trust are keys trusted for this import, beside the host's own and
	// those of its trusted-keys directory (signing.TrustDir).
	Trust TrustedKeys `flag:"trust" usage:"trust this public key (as podman container branch key prints it) for this import (repeatable)"`
	// InsecureUnsigned accepts an archive that is unsigned or signed by a
	// key not trusted. Its contents are then trusted as far as the checks
	// every import makes go, no further (see README.md).
	InsecureUnsigned bool `flag:"insecure-unsigned" usage:"import an archive that is unsigned or signed by a key the host does not trust: its processes then run from images no one vouches for"`
	// SkipTLSVerify pulls a checkpoint image (an import of --image) from
	// a registry without HTTPS and certificate checks.
	SkipTLSVerify bool
}

// TrustedKeys are public keys, as flag values in the form podman container
// branch key prints.
type TrustedKeys []signing.PublicKey

// FlagValues is the keys as text.
func (k TrustedKeys) FlagValues() []string {
	out := make([]string, len(k))
	for i, key := range k {
		out[i] = key.String()
	}
	return out
}

// SetFlagValues reads keys.
func (k *TrustedKeys) SetFlagValues(values []string) error {
	keys := make(TrustedKeys, 0, len(values))
	for _, v := range values {
		key, err := signing.ParsePublicKey(v)
		if err != nil {
			return err
		}
		keys = append(keys, key)
	}
	*k = keys
	return nil
}
