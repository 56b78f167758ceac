package criuhooks

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/kernel/cherrypick"
	"github.com/tclone/tclone/runtime/procfs"
)

// A copy-on-write capture: CRIU dumps everything but the memory it could
// restore lazily (a --lazy-pages dump), and while the tree is still frozen,
// in post-dump, each process's private anonymous memory is taken as a
// vma_cherrypick snapshot, a page-table copy. Siblings then get their lazy
// pages from the snapshots (criuhooks/lazypages with Options.Snapshots).
// The source's pause is CRIU's metadata dump plus fork()'s share of work.

// LazyDump makes the dump of opts a --lazy-pages one that ends at once.
//
// A lazy dump leaves lazily restorable pages out of its images and, once
// post-dump has run, serves them to a lazy-pages daemon from its page
// server, keeping the tree frozen until the daemon has taken every page.
// Here nobody will ask: the caller holds the pages (snapshots, twins).
//
// With external (tclone's build of CRIU, criuhooks/criu), the dump is a
// lazy-pages-external one: CRIU neither reads the lazy pages while it holds
// the tree nor serves them. Otherwise CRIU is given, as its page server's
// connection (ps-socket, which only its configuration file can set over
// RPC), a socket whose peer is already closed, so that the page server
// reads the end of the stream, ends without error and lets the tree go.
// (A listening TCP page server, CRIU's default, would let any local
// process read the source's memory while the tree is frozen.)
//
// workDir is CRIU's work directory, where the configuration file is
// written, with the lines of extra too. The descriptor is left open,
// without close-on-exec, for the criu process go-criu starts next; call
// the returned function once Dump has returned.
func LazyDump(opts *rpc.CriuOpts, workDir string, external bool, extra ...string) (func(), error) {
	conf := append([]string(nil), extra...)
	ps := -1
	if external {
		conf = append(conf, "lazy-pages-external")
	} else {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return nil, fmt.Errorf("lazy dump: page server socket: %w", err)
		}
		unix.Close(fds[1]) // fds[0] reads the end of the stream; it stays inheritable
		ps = fds[0]
		conf = append(conf, "ps-socket "+strconv.Itoa(ps))
	}
	end, err := Configure(opts, workDir, conf)
	if err != nil {
		if ps >= 0 {
			unix.Close(ps)
		}
		return nil, fmt.Errorf("lazy dump: %w", err)
	}
	opts.LazyPages = proto.Bool(true)
	return func() {
		if ps >= 0 {
			unix.Close(ps)
		}
		end()
	}, nil
}

// Task is one process of a dumped tree.
type Task struct {
	ImagePid int32 // its pid in the tree's images (the root's PID namespace)
	HostPid  int   // its pid here
}

// TreeTasks lists the processes of the tree whose root has host pid root,
// each with the pid CRIU's images give it: its pid in the root's PID
// namespace. The tree must not change meanwhile (it is frozen).
func TreeTasks(root int) ([]Task, error) {
	var tasks []Task
	level := -1 // the root's PID namespace, among its pid's levels
	for _, pid := range procfs.Tree(root) {
		ns, err := procfs.NSpid(pid)
		if err != nil {
			return nil, fmt.Errorf("process %d of the dumped tree: %w", pid, err)
		}
		if level < 0 {
			level = len(ns) - 1
		}
		if len(ns) <= level {
			return nil, fmt.Errorf("process %d of the tree of %d is outside its PID namespace", pid, root)
		}
		tasks = append(tasks, Task{ImagePid: int32(ns[level]), HostPid: pid})
	}
	return tasks, nil
}

// Snapshots are the memory of a dumped tree, one snapshot per process with
// memory, by image pid.
type Snapshots struct {
	Files map[int32]*os.File
	// Pages the snapshots hold, resident and swapped out, when taken.
	AnonPages, SwapEntries uint64
	// Took is the time taking them all took: the part of the source's
	// pause they cost.
	Took time.Duration
}

// Close releases every snapshot.
func (s *Snapshots) Close() error {
	var errs []error
	for pid, f := range s.Files {
		errs = append(errs, f.Close())
		delete(s.Files, pid)
	}
	return errors.Join(errs...)
}

// userSpan is the whole user address space of an x86-64 process.
const userSpan = 1<<47 - 4096

// SnapshotTree takes a snapshot of the private anonymous memory of every
// process of tasks, which must all be stopped or frozen (post-dump). A
// process that has no memory any more (a zombie) gets none. All or nothing:
// on failure the snapshots taken so far are released.
func SnapshotTree(dev *cherrypick.Device, tasks []Task) (*Snapshots, error) {
	start := time.Now()
	s := &Snapshots{Files: map[int32]*os.File{}}
	for _, t := range tasks {
		snap, err := snapshotTask(dev, t)
		if err != nil {
			s.Close()
			return nil, err
		}
		if snap == nil {
			continue
		}
		s.Files[t.ImagePid] = snap.File()
		s.AnonPages += snap.AnonPages
		s.SwapEntries += snap.SwapEntries
	}
	s.Took = time.Since(start)
	return s, nil
}

func snapshotTask(dev *cherrypick.Device, t Task) (*cherrypick.Snapshot, error) {
	pidfd, err := unix.PidfdOpen(t.HostPid, 0)
	if err != nil {
		return nil, fmt.Errorf("snapshot of process %d (pid %d in the images): %w", t.HostPid, t.ImagePid, err)
	}
	defer unix.Close(pidfd)
	snap, err := dev.Snapshot(pidfd, 0, userSpan)
	switch {
	case errors.Is(err, cherrypick.ErrProcessExited):
		return nil, nil // a zombie: CRIU dumps no memory for it either
	case errors.Is(err, cherrypick.ErrLayoutMismatch):
		return nil, nil // no private anonymous memory at all
	case err != nil:
		return nil, fmt.Errorf("snapshot of process %d (pid %d in the images): %w", t.HostPid, t.ImagePid, err)
	}
	return snap, nil
}
