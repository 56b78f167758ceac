package fork

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/netlock"
	"github.com/tclone/tclone/runtime/procfs"
)

// sourceHeldError is a capture whose source may still be held by what its
// CRIU left: the CRIU process, a network lock, connections in repair mode.
// Its journal entry stays, so that recovery (every later fork, tclone gc)
// tries again.
type sourceHeldError struct {
	source string
	err    error
}

func (e *sourceHeldError) Error() string {
	return fmt.Sprintf("releasing source %s after its capture: %v; run 'tclone gc' to finish", e.source, e.err)
}

func (e *sourceHeldError) Unwrap() error { return e.err }

// sourceRefs records where the source's processes and network live, for
// undoing what a CRIU that died left there.
func sourceRefs(src *source, tcp forkopts.TCPPolicy) (*journal.SourceRefs, error) {
	refs := &journal.SourceRefs{
		CgroupDir: cgroups.ProcsDir(src.status.CgroupPath),
		// Only a capture that keeps connections dumps them, putting the
		// source's sockets in repair mode meanwhile.
		TCPRepair: tcp.OrClose() == forkopts.TCPKeep,
	}
	path, own := namespacePath(src.spec, "network")
	if !own {
		// The host's network: CRIU locks no namespace of it.
		return refs, nil
	}
	if path == "" {
		path = fmt.Sprintf("/proc/%d/ns/net", src.state.Pid)
	}
	ns, err := netlock.Identify(path)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", src.id, err)
	}
	refs.NetNS, refs.NetNSInode = ns.Path, ns.Inode
	return refs, nil
}

// releaseSource makes sure nothing of a capture's CRIU holds the source any
// more: the CRIU process, the network lock it announced, the repair mode of
// the source's connections. criuFailed says CRIU did not finish well (it
// failed, was killed, or its tclone died), so it may not have undone them.
// Only a capture that reached journal.CaptureSeized has anything to release; the
// caller must keep other captures of the source out meanwhile.
func (e *Engine) releaseSource(r journal.Record, criuFailed bool) error {
	if r.Phase != journal.CaptureSeized {
		return nil
	}
	rec := r.CaptureRec()
	if rec.Criu != nil {
		if err := endProcess(*rec.Criu, criuOwnEndWait); err != nil {
			return &sourceHeldError{source: rec.SourceID, err: err}
		}
	}
	refs := rec.Source
	if refs == nil {
		return nil
	}
	var errs []error
	// Checked even after a CRIU that succeeded: CRIU ignores a failed
	// unlock.
	if refs.NetworkLocked && refs.NetNS != "" {
		found, err := netlock.RemoveLock(netlock.Namespace{Path: refs.NetNS, Inode: refs.NetNSInode})
		errs = append(errs, err)
		if found {
			logrus.Warnf("removed the network lock a capture's CRIU left in %s (source %s)", refs.NetNS, rec.SourceID)
		}
	}
	if refs.TCPRepair && criuFailed && refs.CgroupDir != "" {
		n, err := endTCPRepair(refs.CgroupDir)
		errs = append(errs, err)
		if n > 0 {
			logrus.Warnf("took %d connections of source %s out of the TCP repair mode a capture's CRIU left them in", n, rec.SourceID)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &sourceHeldError{source: rec.SourceID, err: err}
	}
	return nil
}

func endTCPRepair(cgroupDir string) (int, error) {
	pids, err := cgroups.Procs(cgroupDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // the source is gone, and its sockets with it
	}
	if err != nil {
		return 0, err
	}
	return netlock.EndTCPRepair(pids)
}

// criuExitWait bounds the wait for a killed CRIU to be gone. SIGKILL ends a
// process unless it is stuck in the kernel, where it holds the tree anyway.
const criuExitWait = 10 * time.Second

// criuOwnEndWait bounds the wait for a CRIU whose tclone died to end on its
// own: it does at its next message to tclone, and undoes its dump cleanly,
// where a kill could catch one of its system calls in flight in a task of
// the source and kill that task (captureNotify.CriuStarted). A CRIU that
// has not ended by then is killed.
const criuOwnEndWait = 10 * time.Second

// endProcess ends the process p names, if it still runs, and waits until it
// is gone: until then it may still hold the source, or change its network.
// It first gives the process grace to exit by itself, then kills it.
func endProcess(p journal.Owner, grace time.Duration) error {
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	// The pidfd pins the process: if it is the one recorded now, it is the
	// one signalled.
	if !p.Alive() {
		return nil
	}
	// A stopped CRIU (a SIGSTOP to its group) would only wait out the grace.
	unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
	if exited, _ := procfs.PidfdExited(fd, grace); exited {
		return nil
	}
	logrus.Warnf("criu process %d did not end by itself within %s: killing it", p.Pid, grace)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		return fmt.Errorf("killing criu process %d: %w", p.Pid, err)
	}
	if exited, _ := procfs.PidfdExited(fd, criuExitWait); exited {
		return nil
	}
	return fmt.Errorf("criu process %d still runs %s after SIGKILL", p.Pid, criuExitWait)
}
