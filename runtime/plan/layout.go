package plan

import (
	"os"
	"path/filepath"
)

// Layout names every host path where tclone keeps state. The default is
// DefaultLayout; a test lays one out under a scratch directory
// (LayoutUnder), and everything it then does stays there.
//
//	<Root>/plans/<id>/        fork plans (see the package comment)
//	<Root>/plans/.siblings/   private scratch of siblings being made
//	<Root>/plans/.lazy/       lazy-pages daemons' links to plans' images
//	<Root>/journal/           fork operations in flight (journal)
//	<Root>/locks/             lock files of sources and fork requests
//	<Root>/intents/           fork intents, and their failed captures' results
//	<Root>/calls/             fork client calls in progress (calls)
//	<Root>/lazy/              lazy-pages daemons' sockets and locks (lazy)
//	<Root>/criu-check.json    the last successful CRIU check (criucheck)
//	<Root>/tmp/               fork clients' temporary directories (calls)
//	<Root>/tclone.sock        tclone's API service (tclone-service)
//	<SnapshotRoot>/<id>/      root filesystem captures
//	<LogDir>/                 CRIU logs of failed operations
//	<Branches>/               branches (runtime/branch)
//	<Keys>/                   the host's signing key (runtime/branch/signing)
//	<TrustedKeys>/            the keys the host's imports trust
//	<Podman>                  Podman's CLI, where no Podman service answers
//
// Each binary's main builds one (HostLayout) and passes it down.
type Layout struct {
	// Root holds tclone's live state. It is tmpfs, or its plans directory
	// is made one (Store.EnsureTmpfs): page images never touch a disk,
	// and a reboot, which ends every process the state describes, clears it.
	Root string `json:"root"`
	// SnapshotRoot holds root filesystem captures, on disk next to the
	// container storage so that copies can reflink.
	SnapshotRoot string `json:"snapshot_root"`
	// LogDir keeps the CRIU logs of failed operations, whose work
	// directories are removed with everything else the failure left.
	LogDir string `json:"log_dir"`
	// Branches holds the branch store: on a disk, since branches outlive
	// a reboot.
	Branches string `json:"branches,omitempty"`
	// Keys holds the host's signing key, root's only; TrustedKeys the
	// public keys an import trusts beside it.
	Keys        string `json:"keys,omitempty"`
	TrustedKeys string `json:"trusted_keys,omitempty"`
	// Podman is Podman's own CLI (not tclone's wrapper of it).
	Podman string `json:"podman,omitempty"`
}

// DefaultLayout is where tclone keeps its state on a host.
func DefaultLayout() Layout {
	return Layout{Root: "/run/tclone", SnapshotRoot: "/var/lib/tclone/snapshots", LogDir: "/var/log/tclone",
		Branches: "/var/lib/tclone/branches", Keys: "/var/lib/tclone/signing", TrustedKeys: "/etc/tclone/trusted-keys",
		Podman: "/usr/bin/podman"}
}

// Environment variables that move a part of the host's layout, for tests
// and for hosts that keep branches or keys elsewhere.
const (
	EnvBranches    = "TCLONE_BRANCH_DIR"
	EnvKeys        = "TCLONE_SIGNING_DIR"
	EnvTrustedKeys = "TCLONE_TRUSTED_KEYS_DIR"
)

// HostLayout is DefaultLayout, with the parts the environment moves moved.
// A binary's main calls it once.
func HostLayout() Layout {
	l := DefaultLayout()
	for env, field := range map[string]*string{EnvBranches: &l.Branches, EnvKeys: &l.Keys, EnvTrustedKeys: &l.TrustedKeys} {
		if d := os.Getenv(env); d != "" {
			*field = d
		}
	}
	return l
}

// LayoutUnder lays tclone's state out under dir, which must exist.
func LayoutUnder(dir string) Layout {
	return Layout{
		Root:         filepath.Join(dir, "run"),
		SnapshotRoot: filepath.Join(dir, "snapshots"),
		LogDir:       filepath.Join(dir, "log"),
		Branches:     filepath.Join(dir, "branches"),
		Keys:         filepath.Join(dir, "signing"),
		TrustedKeys:  filepath.Join(dir, "trusted-keys"),
		Podman:       DefaultLayout().Podman,
	}
}

// TempDir is where the fork clients of the host make their temporary
// directories: root's and 0700 (see package runtime/calls).
func (l Layout) TempDir() string { return filepath.Join(l.Root, "tmp") }

// ServiceSocket is where tclone's API service listens by default.
func (l Layout) ServiceSocket() string { return filepath.Join(l.Root, "tclone.sock") }

// PlansDir is the tmpfs directory that holds every plan.
func (l Layout) PlansDir() string { return filepath.Join(l.Root, "plans") }

// SiblingDir is the private scratch directory of a sibling being
// materialised. It is on the plan store's tmpfs, so it can hard-link the
// plan's images.
func (l Layout) SiblingDir(id string) string { return filepath.Join(l.PlansDir(), ".siblings", id) }

// LazyImagesDir holds the lazy-pages daemons' hard links to their plans'
// images: on the plans' tmpfs, where such links can be made.
func (l Layout) LazyImagesDir() string { return filepath.Join(l.PlansDir(), ".lazy") }

// LazyDir holds the lazy-pages daemons' control sockets and lock files.
func (l Layout) LazyDir() string { return filepath.Join(l.Root, "lazy") }

// JournalDir holds the records of fork operations in flight.
func (l Layout) JournalDir() string { return filepath.Join(l.Root, "journal") }

// LocksDir holds tclone's lock files: one per source for its captures, one
// per container for its fork requests. A file is made the first time
// something locks it, and `tclone gc` removes those no one holds
// (Store.CollectLocks); so everything that locks a file here must use Lock,
// which notices a file removed while it waited.
func (l Layout) LocksDir() string { return filepath.Join(l.Root, "locks") }

// IntentsDir holds fork intents and the results of their failed captures.
func (l Layout) IntentsDir() string { return filepath.Join(l.Root, "intents") }

// CallsDir holds the records of fork client calls in progress.
func (l Layout) CallsDir() string { return filepath.Join(l.Root, "calls") }

// TrackDir holds the sources' write tracking states (runtime/wptrack).
func (l Layout) TrackDir() string { return filepath.Join(l.Root, "track") }

// CriuCheckFile caches the last successful CRIU check.
func (l Layout) CriuCheckFile() string { return filepath.Join(l.Root, "criu-check.json") }
