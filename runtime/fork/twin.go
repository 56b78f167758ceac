package fork

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/lazy"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/runtime/wptrack"
)

// A twin capture (forkopts.MemoryTwin): copy-on-write memory without the
// module. CRIU makes a lazy dump; while it holds the tree, tclone's CRIU
// plugin gives each process a twin (criuhooks.TwinDump), and once CRIU has
// let the tree go each twin is matched with its process of the images and
// its memory is opened (adopt). The plan's lazy-pages daemon then holds the
// twins for the plan's life (lazy.Hold), and each sibling gets copies of
// their pages. With tclone's build of CRIU no page is read while the tree
// is held; with stock CRIU its lazy dump still reads them all into pipes
// (and throws them away), and the capture's log says so.

// twinHost is what this host offers a twin capture.
type twinHost struct {
	criuhooks.TwinCRIU
	// CriuPath is the criu that dumps: tclone's build, or the host's.
	CriuPath string
}

// twinAvailable says whether this host can capture with twins, and why
// (not). It checks what the plugin and tclone use: x86-64, ptrace of the
// source (Yama's ptrace_scope below 3), a kernel with pidfd_getfd (5.6)
// and close_range's CLOSE_RANGE_UNSHARE (5.9), lazy restores (the
// siblings' memory comes through the plan's daemon), and the plugin built
// for this CRIU.
func twinAvailable(check *criucheck.Result) (twinHost, bool, string) {
	var h twinHost
	if runtime.GOARCH != "amd64" {
		return h, false, "twins are made on x86-64 only"
	}
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
		return h, false, "Yama forbids ptrace on this host (kernel.yama.ptrace_scope = 3)"
	}
	k, err := criucheck.ParseKernel(check.Kernel)
	if err != nil || !(k.Major > 5 || k.Major == 5 && k.Minor >= 9) {
		return h, false, fmt.Sprintf("kernel %s is older than 5.9 (close_range's CLOSE_RANGE_UNSHARE, pidfd_getfd)", check.Kernel)
	}
	if !check.LazyPages {
		return h, false, fmt.Sprintf("siblings get a twin plan's memory through lazy restores, which this host cannot do (%s)", check.NoLazyPages)
	}
	dir := criuDir()
	h.PluginDir = filepath.Join(dir, "plugins")
	if _, err := os.Stat(filepath.Join(h.PluginDir, criuhooks.TwinPluginName)); err != nil {
		return h, false, fmt.Sprintf("tclone's CRIU plugin is not installed (%v): hack/setup-host.sh builds it", err)
	}
	st := readCRIUStamp(dir)
	if built := st.Version; built != check.Version.String() {
		if built == "" {
			built = "an unknown version"
		}
		return h, false, fmt.Sprintf("tclone's CRIU plugin in %s was built for CRIU %s, and CRIU here is %s: run hack/build-criu.sh again", dir, built, check.Version)
	}
	if want := criuhooks.TwinPluginStamp(); st.Plugin != want {
		return h, false, fmt.Sprintf("tclone's CRIU plugin in %s was built from other sources than this tclone's (stamp %q, this tclone's %q): run hack/build-criu.sh again", dir, st.Plugin, want)
	}
	h.CriuPath = check.Path
	if c := externalCRIU(check); c != "" {
		h.CriuPath, h.External = c, true
		return h, true, "tclone's CRIU plugin gives each process a twin, and tclone's build of CRIU reads no page while it holds the tree"
	}
	return h, true, "tclone's CRIU plugin gives each process a twin; with stock CRIU, whose lazy dump still reads every page into pipes while it holds the tree (" + filepath.Join(dir, "criu") + " is not installed)"
}

// twinFits says whether the source's cgroup can hold its twins until they
// are released: one more task per process, and, in the worst case, a copy
// of every private page it has (each page the source writes meanwhile is
// charged to it twice: its new copy, and the twin's old one). A source
// that does not fit is captured the old way by auto, and refused by
// --memory twin, rather than pushed into its OOM killer.
func twinFits(ctx context.Context, src *source, trackDir string) (bool, string) {
	room, err := cgroups.HeadroomOf(src.status.CgroupPath)
	if err != nil {
		return false, fmt.Sprintf("cannot read the limits of the source's cgroup: %v", err)
	}
	tree := procfs.Tree(src.state.Pid)
	for _, pid := range tree {
		if reg, err := lazypages.Registered(pid); err == nil && reg {
			// Unless it is all the write tracking's of branches, which
			// asks to be told of nothing.
			if ours, err := wptrack.Owns(ctx, trackDir, src.id, pid); err != nil || !ours {
				return false, fmt.Sprintf("process %d of the source has memory registered with a userfaultfd, whose reader could be told of its twin", pid)
			}
		}
	}
	if room.Pids != math.MaxInt && room.Pids < len(tree) {
		return false, fmt.Sprintf("the source's pids limit leaves room for %d more tasks, and its %d processes need one twin each", room.Pids, len(tree))
	}
	if room.MemoryBytes == math.MaxUint64 {
		return true, ""
	}
	var anon uint64
	for _, pid := range tree {
		anon += rssAnon(pid)
	}
	if anon > room.MemoryBytes {
		return false, fmt.Sprintf("the source's memory limit leaves %d MiB free, less than the %d MiB of private memory its twins could come to hold while the source writes", room.MemoryBytes>>20, anon>>20)
	}
	return true, ""
}

// rssAnon is a process's resident private anonymous memory (RssAnon), in
// bytes.
func rssAnon(pid int) uint64 {
	st, err := procfs.ReadStatus(pid)
	if err != nil {
		return 0
	}
	return st.RssAnon
}

// twinCapture is a twin capture's memory in the making.
type twinCapture struct {
	host twinHost
	// images is the plan's images directory; births the dump's births
	// file (criuhooks.TwinBirths).
	images, births string
	col            *criuhooks.TwinCollector
	snaps          *criuhooks.TwinSnapshots
	// handedOver: the plan's daemon holds the twins.
	handedOver bool
	// branches is the branch store, where an incremental drain's base is.
	branches string
	// track asks a branch capture to track the source's writes; tracking
	// is the tracking taken for it.
	track    *trackRequest
	tracking *branchTracking
	// source and procs name the source and its cgroup's process list.
	source, procs string
}

func (c *twinCapture) begin(opts *rpc.CriuOpts, workDir string, conf []string) (dumpSetup, error) {
	col, env, err := criuhooks.TwinDump(opts, workDir, c.host.TwinCRIU, conf...)
	if err != nil {
		return dumpSetup{}, err
	}
	c.col = col
	c.births = criuhooks.TwinBirths(workDir)
	if c.track != nil {
		t, tenv, err := c.track.e.startTracking(context.Background(), c.track.source, c.track.gen, workDir)
		if err != nil {
			// The branch copies every page; the capture goes on.
			logrus.Warnf("write tracking: %v (this branch copies all of the source's memory)", err)
		} else {
			c.tracking = t
			env = append(env, tenv...)
		}
	}
	return dumpSetup{env: env, criuPath: c.host.CriuPath, started: col.DumpStarted}, nil
}

// dumpDone ends the collector; twins it has not handed over (the dump
// failed, or take did) are ended and reaped at once.
func (c *twinCapture) dumpDone() {
	if c.col == nil {
		return
	}
	if left := c.col.Close(); len(left) > 0 {
		if err := lazy.ReleaseTwins(left); err != nil {
			logrus.Warnf("twin capture: releasing the twins of a failed dump: %v (tclone gc reaps what is left)", err)
		}
	}
	for _, k := range c.col.KilledTwins() {
		if err := lazy.ReapKilledTwin(k.Pid, k.Killed); err != nil {
			logrus.Warnf("twin capture: %v (it stays a zombie of its process until the process ends)", err)
		}
	}
	c.col = nil
	if c.snaps == nil {
		// A twin killed while its CRIU died too: no message names it.
		if _, err := lazy.ReapUnnamedTwins(c.births); err != nil {
			logrus.Warnf("twin capture: %v (it stays a zombie of its process until the process ends)", err)
		}
	}
	if c.snaps == nil && c.procs != "" {
		// The plugin parks the twins, and hands them over, only once the
		// tree runs again: a dump that failed before let its twins go
		// at the trampoline's exit (criuhooks/criu/twin.c), as zombies
		// of the source's processes.
		if err := awaitTwinsGone(context.Background(), c.source, c.procs, 5*time.Second); err != nil {
			logrus.Warnf("twin capture: the twins of a failed dump: %v (tclone gc reaps what is left)", err)
		}
	}
}

// take has nothing to do with the twins while CRIU holds the tree: the
// plugin made them before the dump, and adopt takes them once the tree
// runs again. A branch capture reads and re-arms its write tracking here.
func (c *twinCapture) take(root int) error {
	if c.tracking != nil {
		c.tracking.scan(c.col, root)
	}
	return nil
}

// adopt takes the twins of the dumped tree, whose root has host pid root,
// from the collector, after CRIU has let the tree go: matching them to the
// images' processes, checking the images, and opening the twins' memory
// add nothing to the source's pause.
func (c *twinCapture) adopt(root int) error {
	snaps, err := c.col.Take(root, c.images)
	if err != nil {
		return takeError(err)
	}
	var tasks []criuhooks.Task
	for pid, t := range snaps.Twins {
		tasks = append(tasks, criuhooks.Task{ImagePid: pid, HostPid: t.Pid})
	}
	if err := criuhooks.CheckTwinnable(c.images, tasks); err != nil {
		snaps.Snapshots.Close()
		if rerr := lazy.ReleaseTwins(snaps.List()); rerr != nil {
			logrus.Warnf("twin capture: releasing the twins: %v (tclone gc reaps what is left)", rerr)
		}
		return &notTwinnable{err}
	}
	c.snaps = snaps
	if c.tracking != nil {
		imagePids := map[int]int32{}
		for ip, t := range snaps.Twins {
			imagePids[t.Pid] = ip
		}
		if err := c.tracking.finish(root, imagePids, c.images); err != nil {
			logrus.Warnf("write tracking: %v (the next branch copies all of the source's memory)", err)
		}
		c.tracking = nil
	}
	return nil
}

func (c *twinCapture) held() lazy.Held {
	return lazy.Held{Snapshots: &c.snaps.Snapshots, Twins: c.snaps.Twins, Branches: c.branches}
}

func (c *twinCapture) handed() { c.handedOver = true }

func (c *twinCapture) taken() bool { return c.snaps != nil }

// release ends and reaps every twin still held here: those handed to the
// plan's daemon are its own (Hold passes it copies).
func (c *twinCapture) release() {
	c.tracking.abort()
	c.tracking = nil
	c.dumpDone()
	if c.snaps == nil {
		return
	}
	c.snaps.Snapshots.Close()
	twins := c.snaps.List()
	c.snaps = nil
	if c.handedOver {
		for _, t := range twins {
			t.Close()
		}
		return
	}
	if err := lazy.ReleaseTwins(twins); err != nil {
		logrus.Warnf("twin capture: releasing the twins: %v (tclone gc reaps what is left)", err)
	}
}

// dumpErr explains a dump the plugin made fail.
func (c *twinCapture) dumpErr() error {
	if c.col == nil {
		return nil
	}
	return c.col.Err()
}

// plannedMemory is the plan's memory as a restore that asks for asked finds
// it. A twin plan's twins are drained into page images right after the
// capture (lazypages' drain.go); once they are, it is a plan like any
// other. A restore that copies (copy, or ksm, which restores as the
// default does) waits for the drain, through the plan's daemon.
func (e *Engine) plannedMemory(ctx context.Context, p *plan.Plan, dir string, asked forkopts.Memory) (forkopts.Memory, error) {
	if p.Memory != forkopts.MemoryTwin {
		return p.Memory, nil
	}
	marker := filepath.Join(plan.ImagesDir(dir), lazypages.DrainedMarker)
	if _, err := os.Stat(marker); err == nil {
		return "", nil
	}
	if asked != forkopts.MemoryCopy {
		return p.Memory, nil
	}
	c, err := lazy.Connect(e.lazyPaths(p.ID))
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.WaitDrained(ctx); err != nil {
		return "", fmt.Errorf("--memory copy of a twin plan waits for its page images: %w", err)
	}
	return "", nil
}

// waitTwinsGone waits until the source has no twin left of an earlier twin
// capture (its plan's daemon drains and releases them right after it), and
// reaps what such twins left: a dump now would take a twin for a process of
// the source. It gives up after timeout.
func waitTwinsGone(ctx context.Context, src *source, timeout time.Duration) error {
	return awaitTwinsGone(ctx, src.id, cgroups.ProcsDir(src.status.CgroupPath), timeout)
}

// awaitTwinsGone is waitTwinsGone for the source id whose cgroup's
// processes procs lists.
func awaitTwinsGone(ctx context.Context, id, procs string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		live, err := lazy.LiveTwins(procs)
		if err != nil {
			return err
		}
		if len(live) == 0 {
			if _, err := lazy.ReapTwinZombies(procs); err != nil {
				return fmt.Errorf("reaping the twins a fork of %s left: %w", id, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still has %d twins of an earlier fork after %s (its plan's lazy-pages daemon copies their memory out, then ends them): try again, or run tclone gc", id, len(live), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// takeError is what a failed take of the twins makes of the capture: a
// twin that died after the thaw makes auto capture again the old way
// (notTwinnable); any other failure fails it, saying what to do.
func takeError(err error) error {
	if errors.Is(err, criuhooks.ErrTwinGone) {
		return &notTwinnable{err}
	}
	return fmt.Errorf("twin capture: %w; the source runs on: fork again, or with --memory lazy or copy", err)
}

// notTwinnable is a source whose memory twins cannot hold (see
// criuhooks.CheckTwinnable), or whose twins died before their memory was
// opened (criuhooks.ErrTwinGone): auto captures it again the old way.
type notTwinnable struct{ err error }

func (e *notTwinnable) Error() string {
	return fmt.Sprintf("twin capture: %v; the source runs on: fork with --memory lazy or copy", e.err)
}

func (e *notTwinnable) Unwrap() error { return e.err }

// WaitTwinsGone makes an ordinary checkpoint of container id (crun's, not a
// fork's) wait until no twin of an earlier twin capture is left in it:
// CRIU would dump the twin as one of the container's processes.
func (e *Engine) WaitTwinsGone(ctx context.Context, id string) error {
	// A paused container can be checkpointed too (containerd pauses it
	// first); its twins would be in it all the same.
	src, err := loadSource(ctx, e.Crun, id, true)
	if err != nil {
		return nil // not one tclone can fork: crun says what is wrong with it
	}
	return waitTwinsGone(ctx, src, time.Minute)
}
