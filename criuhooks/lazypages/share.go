package lazypages

import (
	"errors"
	"fmt"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
)

// Sharing. With snapshots (Options.Snapshots) and Options.ShareWait, a
// restored task's lazy areas get the snapshot's pages themselves,
// copy-on-write, instead of copies: for each area, the filler unregisters it
// from the task's userfaultfd and has vma_cherrypick map the snapshot's pages
// there, as fork() would have. The module wants the task parked, which it is
// from CRIU's last stage until it lets the tasks go: Share is called then,
// from a pre-resume action script. An area the module refuses (a page was
// copied into it already, the kernel merged it with a neighbour once
// unregistered, ...) is registered again and filled by copies as usual; an
// area that can be neither shared nor registered again fails the sibling,
// whose tasks are then killed, never left to read zeros.
//
// Until Share comes, or ShareWait after restore-finished, a filler answers
// faults (by copies) but copies nothing in the background, so that areas
// stay whole for the module.

// shareResult is what sharing one task's areas did.
type shareResult struct {
	areas, refused uint64 // shared, and refused by the module (copied instead)
	bytes          uint64 // lazy bytes shared
	reason         error  // the first refusal's
	err            error  // fatal: an area is left without its memory
}

// shareState is one task's pending share, held by its filler.
type shareState struct {
	dev   *cherrypick.Device
	snap  *cherrypick.Snapshot
	pidfd int
	areas []span
	pause time.Duration // Options.SharePause
	// req brings Share's reply channel; settled closes once the filler
	// shared, gave up waiting, or ended.
	req     chan chan shareResult
	settled chan struct{}
	expired <-chan struct{}
}

// ShareStats sums what Share did for a sibling.
type ShareStats struct {
	Tasks   int    `json:"tasks"`
	Areas   uint64 `json:"areas"`   // areas whose pages are now shared
	Refused uint64 `json:"refused"` // areas the module refused: copied instead
	Bytes   uint64 `json:"bytes"`   // lazy bytes shared rather than copied
	// Reason is the first refusal's, when there was one.
	Reason string `json:"reason,omitempty"`
}

// awaitShare is the filler's side: it answers a pending Share, or gives up
// once the wait expired. It reports whether the filler may go on filling.
func (f *filler) awaitShare() (bool, error) {
	st := f.share
	select {
	case reply := <-st.req:
		res := f.shareAreas()
		reply <- res
		if res.err != nil {
			return false, res.err
		}
	case <-st.expired:
	default:
		return false, nil
	}
	f.share = nil
	close(st.settled)
	return true, nil
}

// shareAreas shares every area of the task whose lazy pages are all still
// missing.
func (f *filler) shareAreas() shareResult {
	st := f.share
	var res shareResult
	for _, a := range st.areas {
		spans := f.miss.extract(a.start, a.end)
		var missing uint64
		for _, s := range spans {
			missing += s.len()
		}
		if missing == 0 {
			continue
		}
		err := f.shareArea(a)
		if err == nil {
			res.areas++
			res.bytes += missing
			continue
		}
		for _, s := range spans {
			f.miss.put(s)
		}
		var refused *refusal
		if !errors.As(err, &refused) {
			res.err = err
			return res
		}
		res.refused++
		if res.reason == nil {
			res.reason = refused.err
		}
	}
	f.host.counters().SharedPages.Add(res.bytes / pageSize)
	return res
}

// refusal is a share the module refused; the area is registered again.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }

func (f *filler) shareArea(a span) error {
	st := f.share
	if err := f.u.unregister(a.start, a.end); err != nil {
		return &refusal{fmt.Errorf("unregister %#x-%#x: %w", a.start, a.end, err)}
	}
	time.Sleep(st.pause)
	_, err := st.dev.CherrypickFrom(st.snap, st.pidfd, a.start, a.len())
	if err == nil {
		return nil
	}
	if rerr := f.u.register(a.start, a.end); rerr != nil {
		return fmt.Errorf("area %#x-%#x could not be shared (%v) nor handed back to the daemon: %w", a.start, a.end, err, rerr)
	}
	return &refusal{err}
}

// Share gives the sibling that has a task of host pid pid the snapshots'
// pages, area by area, and returns once every task is done. Call it while
// CRIU holds the tasks stopped (pre-resume); each task waits for it, up to
// Options.ShareWait after restore-finished, before it copies anything in the
// background.
func (d *Daemon) Share(pid int) (ShareStats, error) {
	s := d.siblingOf(pid)
	if s == nil {
		return ShareStats{}, fmt.Errorf("lazy pages: no sibling being restored has a task with pid %d", pid)
	}
	s.mu.Lock()
	states := append([]*shareState(nil), s.shares...)
	s.mu.Unlock()
	// Every task is asked first and woken once, so that they share at the
	// same time; then their answers are collected.
	replies := make([]chan shareResult, len(states))
	for i, st := range states {
		replies[i] = make(chan shareResult, 1)
		select {
		case st.req <- replies[i]:
		default:
		}
	}
	s.interrupt()
	var sum ShareStats
	var failed error
	deadline := time.After(time.Minute)
	for i, st := range states {
		var res shareResult
		select {
		case res = <-replies[i]:
		case <-st.settled:
			select {
			case res = <-replies[i]:
			default:
				continue // it stopped waiting, or its task is gone
			}
		case <-deadline:
			return sum, fmt.Errorf("lazy pages: the tasks of sibling %d did not take their share in a minute", s.id)
		}
		sum.Tasks++
		sum.Areas += res.areas
		sum.Refused += res.refused
		sum.Bytes += res.bytes
		if res.reason != nil && sum.Reason == "" {
			sum.Reason = res.reason.Error()
		}
		if res.err != nil && failed == nil {
			failed = res.err
		}
	}
	d.emit(Event{Kind: EventShared, Sibling: s.id, Socket: s.socket, Pid: pid, Share: &sum, Err: failed})
	return sum, failed
}

// siblingOf is the sibling one of whose tasks has host pid pid.
func (d *Daemon) siblingOf(pid int) *sibling {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.siblings {
		s.mu.Lock()
		for _, t := range s.tasks {
			if t.host == pid {
				s.mu.Unlock()
				return s
			}
		}
		s.mu.Unlock()
	}
	return nil
}
