package fork

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/procfs"
	"github.com/tclone/tclone/runtime/wptrack"
)

// Incremental branches. A branch capture of a source also tracks its
// writes (runtime/wptrack): each process gets a write-protect-async
// userfaultfd (the twin plugin has it make one while CRIU holds it), and
// while the tree is held each private area is read and protected again.
// The next branch capture then knows, per process, which pages were
// written since, and its drain copies only those out of the twins: the
// others are the last branch's, whose pages it reads from the branch
// store instead (lazypages' Incremental). Between branches a holder keeps
// the userfaultfds (wptrack.Session).

// trackDir is where the sources' tracking states are.
func (e *Engine) trackDir() string { return e.Store.TrackDir() }

// branchTracking is one branch capture's write tracking.
type branchTracking struct {
	sess *wptrack.Session
	gen  string
	// base is the branch the unreported pages equal, "" for none.
	base string
	// trackers by host pid: those the holder kept, then all.
	trackers map[int]*wptrack.Tracker
	// writes is what the scan found, by host pid.
	writes map[int]*lazypages.TaskWrites
	skip   string
}

// startTracking takes source's tracking for capture gen, and returns the
// environment that asks CRIU's twin plugin for the userfaultfds of the
// processes not tracked yet.
func (e *Engine) startTracking(ctx context.Context, source, gen, workDir string) (*branchTracking, []string, error) {
	sess, err := wptrack.Open(ctx, e.trackDir(), source)
	if err != nil {
		return nil, nil, err
	}
	trackers, base, err := sess.Take(gen)
	if err != nil {
		sess.Close()
		return nil, nil, err
	}
	b := &branchTracking{sess: sess, gen: gen, base: base, trackers: trackers, skip: filepath.Join(workDir, "tclone-tracked")}
	var pids strings.Builder
	for pid := range trackers {
		fmt.Fprintf(&pids, "%d\n", pid)
	}
	if err := os.WriteFile(b.skip, []byte(pids.String()), 0o600); err != nil {
		b.abort()
		return nil, nil, err
	}
	return b, []string{criuhooks.TwinTrackEnv + "=" + b.skip}, nil
}

// scan reads and re-arms the tracking of every process of the tree under
// root, while CRIU holds it. A process or area that cannot be tracked is
// recorded as such: all its pages count as written.
func (b *branchTracking) scan(col *criuhooks.TwinCollector, root int) {
	uffds, errs := col.Uffds()
	for pid, err := range errs {
		logrus.Debugf("write tracking: process %d untracked: %v", pid, err)
	}
	b.writes = map[int]*lazypages.TaskWrites{}
	for _, pid := range procfs.Tree(root) {
		tr := b.trackers[pid]
		if tr == nil && uffds[pid] != nil {
			var err error
			if tr, err = wptrack.New(pid, uffds[pid]); err != nil {
				logrus.Debugf("write tracking: process %d untracked: %v", pid, err)
				delete(uffds, pid)
				continue
			}
			delete(uffds, pid)
			b.trackers[pid] = tr
		}
		if tr == nil {
			continue
		}
		w, err := scanProcess(pid, tr)
		if err != nil {
			logrus.Debugf("write tracking: process %d untracked: %v", pid, err)
			tr.Close()
			delete(b.trackers, pid)
			continue
		}
		b.writes[pid] = w
	}
	for _, f := range uffds {
		f.Close()
	}
}

// scanProcess scans every private area of process pid.
func scanProcess(pid int, tr *wptrack.Tracker) (*lazypages.TaskWrites, error) {
	areas, err := privateAreas(pid)
	if err != nil {
		return nil, err
	}
	w := &lazypages.TaskWrites{}
	for _, a := range areas {
		rs, err := tr.Scan(a[0], a[1])
		if errors.Is(err, wptrack.ErrForeign) || errors.Is(err, wptrack.ErrUntrackable) {
			continue
		}
		if err != nil {
			return nil, err
		}
		w.Tracked = append(w.Tracked, lazypages.Range{Start: a[0], End: a[1]})
		for _, r := range rs {
			w.Written = append(w.Written, lazypages.Range{Start: r.Start, End: r.End})
		}
	}
	return w, nil
}

// privateAreas lists the private anonymous areas of pid's memory
// (/proc/PID/maps, which walks no page table), but the kernel's own. A
// file's private mapping is not tracked, though the kernel would register
// it: where its pages go (reclaimed, discarded) it leaves write-protect
// markers, which read as pages swapped out and not written, and which the
// file's content, not the last branch's page, stands behind.
func privateAreas(pid int) ([][2]uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || len(fields[1]) != 4 || fields[1][3] != 'p' || fields[4] != "0" {
			continue
		}
		if len(fields) >= 6 && strings.HasPrefix(fields[5], "[v") { // [vdso], [vvar], [vsyscall]
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, [2]uint64{start, end})
	}
	return out, sc.Err()
}

// finish, once CRIU has let the tree go and its twins are matched
// (imagePids: the images' pid of each host pid), writes what the scan found
// for the plan's drain, and has a holder keep the tracking, pending until
// the branch commits (wptrack.Commit).
func (b *branchTracking) finish(root int, imagePids map[int]int32, imagesDir string) error {
	defer b.abort()
	if b.writes == nil {
		return nil
	}
	writes := lazypages.Writes{Base: b.base, Tasks: map[int32]*lazypages.TaskWrites{}}
	for pid, w := range b.writes {
		if ip, ok := imagePids[pid]; ok {
			writes.Tasks[ip] = w
		}
	}
	data, err := json.Marshal(writes)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(imagesDir, lazypages.WritesFile), data, 0o600); err != nil {
		return err
	}
	return b.sess.Hold(b.gen, root, b.trackers)
}

// abort lets go of the tracking: the trackers taken here close (the
// holder, if any, keeps its own), and the session unlocks.
func (b *branchTracking) abort() {
	if b == nil || b.sess == nil {
		return
	}
	for _, t := range b.trackers {
		t.Close()
	}
	b.trackers = nil
	b.sess.Close()
	b.sess = nil
	os.Remove(b.skip)
}

// trackRequest asks a twin capture to track its source's writes.
type trackRequest struct {
	e      *Engine
	source string
	gen    string
}

// trackingAvailable says whether the kernel has what write tracking needs:
// write-protect-async userfaultfds and PAGEMAP_SCAN (Linux 6.7), and an
// mremap that clears the write-protect bits of the pages it moves out of a
// registered area (6.13, "mm: clear uffd-wp PTE/PMD state on mremap()"):
// before it, a moved page written in its new, unregistered place kept its
// bit, and read as not written once the place was registered.
func trackingAvailable(check *criucheck.Result) bool {
	k, err := criucheck.ParseKernel(check.Kernel)
	return err == nil && (k.Major > 6 || k.Major == 6 && k.Minor >= 13)
}
