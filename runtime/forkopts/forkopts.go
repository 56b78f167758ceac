// Package forkopts is the one model of a fork's options. Every way in
// (`tclone fork`, `tclone restore` of a plan, `podman container fork`, the
// Go client, a fork intent) fills a Fork, Normalize checks it once, and the
// engine renders CRIU's options and crun's arguments from it here, so that
// an option is added in one place.
//
// A Fork has two parts: Capture, what the source's dump asks of CRIU (and
// what the siblings do with its TCP connections), and the plan's part:
// how its siblings differ from the source, how many it serves and how long
// it is kept.
package forkopts

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// Defaults a Normalize fills in.
const (
	// DefaultPlanTTL is how long an unused plan is kept.
	DefaultPlanTTL = 10 * time.Minute
	// DefaultCaptureTimeout bounds a capture's CRIU dump, and so the
	// source's pause: about 25 GiB of memory at a dump speed of 400 MiB/s.
	DefaultCaptureTimeout = 60 * time.Second
)

// The groups of a fork's flags, as Fork's tags name them (see
// shim/flagtable): a command takes or leaves each as a whole.
const (
	// GroupCapture is what the dump asks of CRIU: --tcp-established,
	// --tcp-close, --file-locks, --ext-unix-sk, --shell-job.
	GroupCapture = "capture"
	// GroupMemory is --memory.
	GroupMemory = "memory"
	// GroupSibling is how siblings differ from the source: --identity.
	GroupSibling = "sibling"
	// GroupFiles is --files-only.
	GroupFiles = "files"
	// GroupPlan is a plan's life: --uses, --ttl.
	GroupPlan = "plan"
	// GroupTimeout is --capture-timeout.
	GroupTimeout = "timeout"
)

// Unlimited is the Uses of a plan that serves any number of siblings until
// it expires.
const Unlimited = -1

// Fork is one fork's options.
type Fork struct {
	Capture
	// Identity says how siblings differ from the source.
	Identity Identity `json:"identity" flag:"identity" group:"sibling" usage:"unique: each sibling gets its own hostname and machine-id, and a source where one cannot differ (--uts=host, a mounted /etc/machine-id) is refused; best-effort: the same where possible, keeping what cannot change (--print-stats says what was kept); preserve: the source's"`
	// Memory is how siblings get the source's memory; empty means auto:
	// copy-on-write where the vma_cherrypick module is loaded, else lazy
	// where this host can, else copy.
	Memory Memory `json:"memory,omitempty" flag:"memory" group:"memory" usage:"how a sibling gets the source's memory: auto (the default: cow where the vma_cherrypick module is loaded, else twin where tclone's CRIU plugin is installed, else lazy where CRIU and the kernel support it, else copy), cow (shared copy-on-write, as fork() shares it: the source is held for page-table copies only, and siblings map its pages), twin (copy-on-write without the module: each process gets a twin while the source is held, for page-table copies only, and siblings run at once on copies of its pages), lazy (it runs at once and receives copies of its memory while it runs), copy (every page is copied before it runs), or ksm (as lazy, and the sibling is mergeable: with a source run with the annotation io.tclone.memory-merge=true, ksmd shares their identical pages again)"`
	// Uses is how many siblings the plan serves, or Unlimited; 0 means 1.
	Uses int `json:"uses" flag:"uses" group:"plan" usage:"how many siblings the plan serves (-1: any number until it expires)"`
	// TTL bounds how long an unused plan is kept; 0 means DefaultPlanTTL.
	TTL time.Duration `json:"ttl" flag:"ttl" group:"plan" usage:"how long an unused plan is kept"`
	// CaptureTimeout bounds the dump, and so the source's pause: on
	// expiry CRIU is stopped and the source runs on. 0 means
	// DefaultCaptureTimeout.
	CaptureTimeout time.Duration `json:"capture_timeout,omitempty" flag:"capture-timeout" group:"timeout" usage:"longest the source may be held for the capture; then CRIU is stopped, the source runs on and the fork fails"`
	// FilesOnly captures the root filesystem and the volumes only, with no
	// process: each sibling runs its command from the start on the
	// source's files.
	FilesOnly bool `json:"files_only,omitempty" flag:"files-only" group:"files" usage:"take the source's files only (root filesystem and volumes, while its processes are held still for a moment): each sibling runs its command from the start on them, with none of the source's processes or memory"`
	// Durable: the capture must end as page images, for a branch that
	// outlives it. Auto then never takes module snapshots (they live only
	// as long as the plan); twins are drained into images, and do.
	Durable bool `json:"durable,omitempty"`
	// BranchStore, for a durable capture, is the branch store its branch
	// is written to, which holds the branch before it: an incremental
	// branch's drain reads the pages the source did not write since from
	// there.
	BranchStore string `json:"branch_store,omitempty"`
	// Volumes are the source's mounted volumes each sibling gets its own
	// copy of, as they were at the fork instant. Every other mount of a
	// host directory is shared with the source.
	Volumes []Volume `json:"volumes,omitempty"`
}

// Volume is a host directory mounted in the source whose contents are
// copied, at the fork instant, into the sibling's own directory mounted at
// the same place.
type Volume struct {
	// Name is what the user calls it: a Podman volume's name, say.
	Name string `json:"name"`
	// Source is the host directory the source mounts at Destination.
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// Capture is what the source's dump asks of CRIU.
type Capture struct {
	// TCP is what the siblings do with their copies of the source's
	// established TCP connections; it decides the dump's TCP options.
	// Empty means none was asked for: Normalize makes it TCPClose.
	TCP TCPPolicy `json:"tcp_policy,omitempty" flag:"tcp-established=keep,tcp-close=close" group:"capture" usage:"keep open TCP connections: a sibling carries on the source's connections (only a sibling in the source's own network namespace; podman container fork refuses it) | close the sibling's copies of the source's open TCP connections; the source keeps them (what a fork does by default)"`
	// FileLocks dumps and restores file locks.
	FileLocks bool `json:"file_locks,omitempty" flag:"file-locks" group:"capture" usage:"capture and restore file locks"`
	// ExtUnixSk allows unix sockets connected outside the container.
	ExtUnixSk bool `json:"ext_unix_sk,omitempty" flag:"ext-unix-sk" group:"capture" usage:"allow unix sockets connected outside the container"`
	// ShellJob allows a tree attached to an outside terminal session.
	ShellJob bool `json:"shell_job,omitempty" flag:"shell-job" group:"capture" usage:"allow a tree attached to an outside terminal session"`
	// GhostLimit is the largest file the source holds open after it was
	// deleted (a temporary file) that the dump copies; a larger one fails
	// the capture. 0 means DefaultGhostLimit.
	GhostLimit Size `json:"ghost_limit,omitempty" flag:"ghost-limit" group:"capture" usage:"largest deleted file still open in the source (a temporary file) that the capture copies, while the source is held (k, M or G; default 64M)"`
}

// DefaultGhostLimit is the ghost limit of a capture that names none. CRIU's
// own, 1M, fails the fork of a workspace whose test runner or editor holds
// a larger temporary file open; copying 64M holds the source for tens of
// milliseconds more.
const DefaultGhostLimit = 64 * MiB

// maxGhostLimit is the largest CRIU takes (its option is 32 bits).
const maxGhostLimit = Size(1<<32 - 1)

// Normalize checks every option and fills the defaults. Each way in calls
// it before anything is made, so a bad option never leaves anything behind.
func (f *Fork) Normalize() error {
	id, err := ParseIdentity(string(f.Identity))
	if err != nil {
		return err
	}
	f.Identity = id
	if f.Memory, err = ParseMemory(string(f.Memory)); err != nil {
		return err
	}
	switch f.TCP {
	case "":
		f.TCP = TCPClose
	case TCPClose, TCPKeep:
	default:
		return fmt.Errorf("unknown TCP policy %q (use close or keep)", f.TCP)
	}
	switch {
	case f.Uses == 0:
		f.Uses = 1
	case f.Uses < Unlimited:
		return fmt.Errorf("uses %d: give a number of siblings (1 or more), or %d for any number until the plan expires", f.Uses, Unlimited)
	}
	switch {
	case f.TTL == 0:
		f.TTL = DefaultPlanTTL
	case f.TTL < 0:
		return fmt.Errorf("plan TTL %s is negative: give how long an unused plan is kept, such as 10m", f.TTL)
	}
	switch {
	case f.GhostLimit == 0:
		f.GhostLimit = DefaultGhostLimit
	case f.GhostLimit < 0 || f.GhostLimit > maxGhostLimit:
		return fmt.Errorf("ghost limit %s: give a size below 4G", f.GhostLimit)
	}
	switch {
	case f.CaptureTimeout == 0:
		f.CaptureTimeout = DefaultCaptureTimeout
	case f.CaptureTimeout < 0:
		return fmt.Errorf("capture timeout %s is negative: give a positive duration, such as 60s", f.CaptureTimeout)
	}
	seen := map[string]bool{}
	for _, v := range f.Volumes {
		for _, p := range []string{v.Source, v.Destination} {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				return fmt.Errorf("volume %q: %q is not a clean absolute path", v.Name, p)
			}
		}
		if seen[v.Destination] {
			return fmt.Errorf("volume %q: two volumes to copy are mounted at %s", v.Name, v.Destination)
		}
		seen[v.Destination] = true
	}
	return nil
}

// Identity is a sibling identity policy.
type Identity string

const (
	// IdentityUnique gives each sibling its own hostname and machine-id.
	IdentityUnique Identity = "unique"
	// IdentityBestEffort is unique, but a part that cannot be changed is
	// left as it is instead of failing the fork.
	IdentityBestEffort Identity = "best-effort"
	// IdentityPreserve keeps the source's identity.
	IdentityPreserve Identity = "preserve"
)

// ParseIdentity validates an identity policy name; empty means unique.
func ParseIdentity(s string) (Identity, error) {
	switch Identity(s) {
	case "":
		return IdentityUnique, nil
	case IdentityUnique, IdentityBestEffort, IdentityPreserve:
		return Identity(s), nil
	}
	return "", fmt.Errorf("unknown identity policy %q (use unique, best-effort or preserve)", s)
}

// AnnotationMerge, set to "true" on a container run by tclone, makes its
// processes mergeable from their first instruction, so that ksmd can share
// its pages with its siblings' (MemoryKSM).
const AnnotationMerge = "io.tclone.memory-merge"

// Memory is how a sibling gets the source's memory.
type Memory string

const (
	// MemoryLazy starts the sibling as soon as its tasks are rebuilt; a
	// lazy-pages daemon gives it its memory while it runs, on demand and
	// in the background. It needs userfaultfd (criucheck says).
	MemoryLazy Memory = "lazy"
	// MemoryCopy has CRIU copy every page before the sibling runs.
	MemoryCopy Memory = "copy"
	// MemoryKSM gets the memory as the default does (lazy where
	// possible), and marks the sibling mergeable as a whole, with ksmd
	// turned up while the fork is young: its pages identical to the
	// source's (marked likewise) are shared again. For hosts without the
	// vma_cherrypick module.
	MemoryKSM Memory = "ksm"
	// MemoryCow shares the source's memory copy-on-write, as fork() does:
	// the capture takes a vma_cherrypick snapshot of each process while
	// the tree is held, instead of having CRIU copy its pages, and each
	// sibling maps the snapshots' pages. It needs the module, and lazy
	// restores (the pages reach the sibling through the plan's lazy-pages
	// daemon, which holds the snapshots).
	MemoryCow Memory = "cow"
	// MemoryTwin shares the source's memory copy-on-write without the
	// module: while the tree is held, each process gets a twin, a clone
	// without CLONE_VM that never runs (criuhooks/criu), whose memory is
	// the process's at that instant as fork() shares it; each sibling
	// gets copies of the twins' pages through the plan's lazy-pages
	// daemon, which holds the twins until the plan is used up. It needs
	// tclone's CRIU plugin, lazy restores and ptrace.
	MemoryTwin Memory = "twin"
	// MemoryAuto is cow where the module is loaded, else twin where the
	// host can, else the default.
	MemoryAuto Memory = "auto"
)

// Held says whether a plan captured with m holds no page images of its
// own: its memory is held by the plan's lazy-pages daemon (the module's
// snapshots, or twins), and reaches its siblings through that daemon only.
func (m Memory) Held() bool { return m == MemoryCow || m == MemoryTwin }

// CaptureHost is what this host can capture, as Memory.Capture weighs it:
// each mode's availability, and why (not).
type CaptureHost struct {
	Cow     bool
	CowWhy  string
	Twin    bool
	TwinWhy string
}

// ParseMemory validates a memory mode; empty means auto and stays empty.
func ParseMemory(s string) (Memory, error) {
	switch Memory(s) {
	case "", MemoryLazy, MemoryCopy, MemoryKSM, MemoryCow, MemoryTwin, MemoryAuto:
		return Memory(s), nil
	}
	return "", fmt.Errorf("unknown memory mode %q (use auto, cow, twin, lazy, copy or ksm)", s)
}

// Capture decides how a capture asked for m takes the source's memory, on
// a host that can do what h says. It returns the memory mode the plan
// records (cow, twin, or what was asked with auto made the default, "")
// and why, for the capture's log.
func (m Memory) Capture(h CaptureHost) (Memory, string, error) {
	switch m {
	case MemoryCow:
		if !h.Cow {
			return "", "", fmt.Errorf("--memory cow: %s; load the vma_cherrypick module (kernel/vma_cherrypick), or fork with --memory twin, lazy or copy", h.CowWhy)
		}
		return MemoryCow, h.CowWhy, nil
	case MemoryTwin:
		if !h.Twin {
			return "", "", fmt.Errorf("--memory twin: %s; fork with --memory lazy or copy", h.TwinWhy)
		}
		return MemoryTwin, h.TwinWhy, nil
	case "", MemoryAuto:
		switch {
		case h.Cow:
			return MemoryCow, h.CowWhy, nil
		case h.Twin:
			return MemoryTwin, fmt.Sprintf("no copy-on-write module (%s); twins instead: %s", h.CowWhy, h.TwinWhy), nil
		}
		return "", fmt.Sprintf("pages copied while the source is held: no copy-on-write module (%s), no twins (%s)", h.CowWhy, h.TwinWhy), nil
	}
	return m, "asked for", nil
}

// Resolve decides the memory mode of one restore: asked is what the
// restore or the plan asked for ("" or auto for the best the plan and the
// host allow), planned the plan's own mode; lazyOK and why are what the
// host can do. A copy-on-write plan holds no page images: its siblings map
// the snapshots' pages (cow) or get copies of them (lazy), both through its
// lazy-pages daemon.
func (m Memory) Resolve(planned Memory, lazyOK bool, why string) (Memory, error) {
	if planned.Held() {
		switch {
		case m == MemoryCopy || m == MemoryKSM:
			return "", fmt.Errorf("--memory %s: the plan was captured copy-on-write (%s) and holds no page images; restore it with --memory lazy, or fork again with --memory %s", m, planned, m)
		case !lazyOK:
			return "", fmt.Errorf("this host cannot restore memory lazily (%s), which a copy-on-write plan needs; fork with --memory copy", why)
		case m == MemoryCow && planned == MemoryTwin:
			return "", errors.New("--memory cow: the plan's memory is held by twins, not by vma_cherrypick snapshots: its siblings get copies of its pages (--memory lazy)")
		case m == MemoryLazy || planned == MemoryTwin:
			return MemoryLazy, nil
		}
		return MemoryCow, nil
	}
	switch {
	case m == MemoryCow || m == MemoryTwin:
		return "", fmt.Errorf("--memory %s: the plan was captured without copy-on-write (the host could not, or another mode was asked); fork with --memory %s", m, m)
	case m == MemoryCopy:
		return MemoryCopy, nil
	case lazyOK:
		return MemoryLazy, nil
	case m == MemoryLazy:
		return "", fmt.Errorf("--memory lazy: this host cannot restore memory lazily (%s); fork with --memory copy", why)
	}
	return MemoryCopy, nil
}

// TCPPolicy is what a sibling does with its copies of the source's
// established TCP connections.
type TCPPolicy string

const (
	// TCPClose closes the sibling's copies: its processes read end of file
	// and their writes fail, while the source keeps its connections and
	// its peers see nothing of the fork. The default.
	TCPClose TCPPolicy = "close"
	// TCPKeep lets the sibling carry on the source's connections, with the
	// source's addresses and sequence numbers. Only a sibling in the
	// source's own network namespace may: from anywhere else its packets
	// would reach the source's peers as if the source sent them.
	TCPKeep TCPPolicy = "keep"
)

// TCPFromFlags reads the --tcp-established/--tcp-close pair (crun's and
// tclone's spelling); neither gives "", no policy asked for.
func TCPFromFlags(established, close bool) (TCPPolicy, error) {
	switch {
	case established && close:
		return "", errors.New("--tcp-established and --tcp-close exclude each other")
	case established:
		return TCPKeep, nil
	case close:
		return TCPClose, nil
	}
	return "", nil
}

// OrClose is the policy, with close for none given (and for plans from
// before the policy was recorded).
func (p TCPPolicy) OrClose() TCPPolicy {
	if p == "" {
		return TCPClose
	}
	return p
}

// String shows every option by name, for logs.
func (f Fork) String() string {
	type plain Fork // without this method
	return fmt.Sprintf("%+v", plain(f))
}
