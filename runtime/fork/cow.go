package fork

import (
	"fmt"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/kernel/cherrypick"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/lazy"
)

// A copy-on-write capture (forkopts.MemoryCow): CRIU makes a --lazy-pages
// dump that copies no page, and in post-dump, while the tree is still
// held, each process's private anonymous memory is taken as a
// vma_cherrypick snapshot (page tables only, as fork() copies them). The
// plan's lazy-pages daemon then holds the snapshots for the plan's life
// (lazy.Hold), and each sibling maps their pages.

// cowAvailable says whether this host can capture copy-on-write, and why
// (not).
func cowAvailable(check *criucheck.Result) (bool, string) {
	v, err := cherrypick.Probe()
	if err != nil {
		return false, fmt.Sprintf("vma_cherrypick: %v", err)
	}
	if !v.Has(cherrypick.FeatureSnapshot | cherrypick.FeatureAnon) {
		return false, fmt.Sprintf("the loaded vma_cherrypick (features %#x) takes no snapshots: load this version of the module", uint64(v.Features))
	}
	if !check.LazyPages {
		return false, fmt.Sprintf("siblings get a copy-on-write plan's memory through lazy restores, which this host cannot do (%s)", check.NoLazyPages)
	}
	return true, fmt.Sprintf("vma_cherrypick %d is loaded with snapshots (features %#x)", v.ABI, uint64(v.Features))
}

// cowCapture is a copy-on-write capture's memory in the making.
type cowCapture struct {
	// criu is tclone's build of CRIU (lazy-pages-external), or "" for
	// the host's, whose lazy dump still reads every page into pipes while
	// it holds the tree.
	criu  string
	dev   *cherrypick.Device
	snaps *criuhooks.Snapshots
	// endDump undoes what criuhooks.LazyDump set up for CRIU.
	endDump func()
}

// begin opens the module and makes opts a lazy dump that ends at once.
func (c *cowCapture) begin(opts *rpc.CriuOpts, workDir string, conf []string) (dumpSetup, error) {
	var err error
	if c.dev, err = cherrypick.Open(); err != nil {
		return dumpSetup{}, fmt.Errorf("--memory cow: %w", err)
	}
	if c.endDump, err = criuhooks.LazyDump(opts, workDir, c.criu != "", conf...); err != nil {
		c.dev.Close()
		c.dev = nil
		return dumpSetup{}, err
	}
	return dumpSetup{criuPath: c.criu}, nil
}

// dumpDone closes what the dump needed; the snapshots stay.
func (c *cowCapture) dumpDone() {
	if c.endDump != nil {
		c.endDump()
		c.endDump = nil
	}
	if c.dev != nil {
		c.dev.Close()
		c.dev = nil
	}
}

// take snapshots every process of the tree whose root is host pid root,
// which CRIU holds (post-dump). The time it records covers finding the
// tree's processes in /proc too: both are in the source's pause.
func (c *cowCapture) take(root int) error {
	start := time.Now()
	tasks, err := criuhooks.TreeTasks(root)
	if err != nil {
		return fmt.Errorf("copy-on-write snapshot: %w", err)
	}
	if c.snaps, err = criuhooks.SnapshotTree(c.dev, tasks); err != nil {
		return fmt.Errorf("copy-on-write snapshot: %w; the source runs on: fork with --memory lazy or copy to capture without the module", err)
	}
	c.snaps.Took = time.Since(start)
	return nil
}

// release closes this process's snapshots (the daemon has its own once
// they are handed over) and whatever the dump left open.
func (c *cowCapture) release() {
	c.dumpDone()
	if c.snaps != nil {
		c.snaps.Close()
	}
}

func (c *cowCapture) held() lazy.Held { return lazy.Held{Snapshots: c.snaps} }

// adopt has nothing left to do: take made the snapshots while CRIU held
// the tree.
func (c *cowCapture) adopt(int) error { return nil }

func (c *cowCapture) taken() bool { return c.snaps != nil }

func (c *cowCapture) dumpErr() error { return nil }

// handed: the daemon has its own copies of the snapshots' descriptors.
func (c *cowCapture) handed() {}
