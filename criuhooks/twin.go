package criuhooks

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// A twin capture (forkopts.MemoryTwin) needs no kernel module. CRIU makes a
// lazy dump, which leaves every lazily restorable page out of the images,
// and tclone's CRIU plugin (criuhooks/criu/twin.c) gives each process of
// the held tree a twin: a child cloned without CLONE_VM, whose memory is
// the process's at the dump's instant, shared copy-on-write as fork()
// shares it, and which never runs. Siblings then read their lazy pages from
// the twins' /proc/PID/mem, as they read a vma_cherrypick snapshot.
//
// With tclone's build of CRIU (lazy-pages-external, criuhooks/criu) the
// lazy pages are only listed in the pagemap; stock CRIU's lazy dump also
// reads every one of them into pipes while it holds the tree, so that the
// source's pause then still grows with its memory.

// TwinCRIU is what a twin dump needs of the host's CRIU.
type TwinCRIU struct {
	// PluginDir holds tclone's twin plugin (tclone_twin.so).
	PluginDir string
	// External: this CRIU has the lazy-pages-external option.
	External bool
}

// twinMsgSize is sizeof(struct twin_msg) in criuhooks/criu/twin.h.
const (
	twinMsgVersion = 4
	twinWhyLen     = 240
	twinNSMax      = 8
	twinMsgSize    = twinWhyOff + twinWhyLen + 4 + 4*twinNSMax + 4 + 4
	// twinWhyOff is where the message's why starts, after its five
	// 32-bit fields.
	twinWhyOff = 5 * 4
	// The messages' kinds: a twin (or why there is none), and a
	// process's userfaultfd for write tracking.
	twinKindTwin  = 0
	twinKindTrack = 1
	// twinSockBuf is the plugin's send buffer (twinSocket): room for
	// the messages of some 7000 processes (a queued message takes about
	// 1.1 KiB of it).
	twinSockBuf = 8 << 20
	// twinFDEnv names the plugin's socket in CRIU's environment.
	twinFDEnv = "TCLONE_TWIN_FD"
	// TwinTrackEnv, in CRIU's environment, asks the plugin for the
	// processes' userfaultfds, but for those of the pids the file it
	// names lists (criuhooks/criu/twin.h).
	TwinTrackEnv = "TCLONE_TWIN_TRACK"
	// twinBirthsEnv names, in CRIU's environment, the file the plugin
	// notes each twin's birth in (TwinBirths).
	twinBirthsEnv = "TCLONE_TWIN_BIRTHS"
)

// TwinBirths is the file in a twin dump's work directory where the plugin
// notes, before each clone, the process, its cloning thread, the time and
// that thread's children (criuhooks/criu/twin.h): what finds a twin killed
// before it named itself once its capture died too
// (runtime/lazy.ReapUnnamedTwins).
func TwinBirths(workDir string) string { return filepath.Join(workDir, "twin-births") }

// Twin is one process's twin, as the plugin handed it over.
type Twin struct {
	// Pid is the process's pid here; TwinPid its twin's.
	Pid, TwinPid int
	// NSpid is the process's pid at each level of its PID namespaces,
	// from here down, as the plugin read it while CRIU held the process.
	NSpid []int
	// Pidfd and Lifeline are the twin's pidfd and the write end of its
	// pipe: closing the last copy of the lifeline kills the twin.
	Pidfd, Lifeline *os.File
	// Uffd is a userfaultfd the process made, for write tracking
	// (TwinDump's track), nil when none was asked for or making it
	// failed (TrackErr says why). The plugin sends it in a message of its
	// own (TwinCollector.Uffds), not with the twin.
	Uffd     *os.File
	TrackErr error
	// Clone is what making it added to the pause (the plugin parks
	// it once the tree runs again).
	Clone time.Duration
}

// Close closes the twin's descriptors; it dies once no copy of its
// lifeline is left anywhere.
func (t *Twin) Close() {
	if t.Pidfd != nil {
		t.Pidfd.Close()
	}
	if t.Lifeline != nil {
		t.Lifeline.Close()
	}
	if t.Uffd != nil {
		t.Uffd.Close()
	}
}

// TwinDump makes the dump of opts a twin dump: CRIU loads the plugin from
// c.PluginDir, whose messages the returned collector gathers while CRIU
// runs. It sets env (CRIU's environment) and writes CRIU's configuration
// file into workDir, with the lines of extra too. Call Close on the
// collector once the dump is over; the twins it gathered stay open until
// released.
func TwinDump(opts *rpc.CriuOpts, workDir string, c TwinCRIU, extra ...string) (*TwinCollector, []string, error) {
	if _, err := os.Stat(filepath.Join(c.PluginDir, TwinPluginName)); err != nil {
		return nil, nil, fmt.Errorf("tclone's CRIU plugin is not installed: %w (hack/setup-host.sh builds it)", err)
	}
	fds, err := twinSocket()
	if err != nil {
		return nil, nil, err
	}
	col := &TwinCollector{recv: os.NewFile(uintptr(fds[0]), "twin socket"), send: fds[1], got: map[int]*Twin{},
		tracks: map[int]*Twin{}, done: make(chan struct{})}
	go col.gather()
	// CRIU inherits the plugin's end; the plugin makes it close-on-exec.
	if _, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETFD, 0); err != nil {
		col.Close()
		return nil, nil, fmt.Errorf("twin dump: %w", err)
	}
	end, err := LazyDump(opts, workDir, c.External, append([]string{"libdir " + c.PluginDir}, extra...)...)
	if err != nil {
		col.Close()
		return nil, nil, err
	}
	col.endDump = end
	return col, []string{twinFDEnv + "=" + strconv.Itoa(fds[1]), twinBirthsEnv + "=" + TwinBirths(workDir)}, nil
}

// twinSocket makes the socket pair the plugin sends its messages on
// (fds[1], the plugin's end) and the collector reads (fds[0]). The plugin
// sends one message a process while CRIU holds the tree, and blocks on a
// full buffer until the collector drained three quarters of it: with the
// default buffer, after about 180 processes, which held a 200-process
// source some 50 ms longer. The plugin's end gets room for all of them.
func twinSocket() ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fds, fmt.Errorf("twin dump: the plugin's socket: %w", err)
	}
	// Past the host's wmem_max where tclone may (root).
	if err := unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, twinSockBuf); err != nil {
		err = unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_SNDBUF, twinSockBuf)
		if err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return fds, fmt.Errorf("twin dump: the plugin's socket buffer: %w", err)
		}
	}
	return fds, nil
}

// TwinPluginName is the plugin's file in its directory.
const TwinPluginName = "tclone_twin.so"

// TwinCollector gathers the twins the plugin hands over during a dump.
type TwinCollector struct {
	recv *os.File
	send int
	// endDump undoes LazyDump.
	endDump func()
	done    chan struct{}

	closing atomic.Bool

	mu  sync.Mutex
	got map[int]*Twin // by process pid
	// tracks holds the processes' userfaultfds (TwinDump's track), by
	// process pid: each in a Twin of its own, with only Pid, Uffd and
	// TrackErr set. The plugin sends them while CRIU holds the tree, its
	// twins only once the tree runs again.
	tracks map[int]*Twin
	errs   []error
}

// DumpStarted closes this process's copy of the plugin's end, once CRIU
// has started and holds its own: the collector then sees the end of the
// stream when CRIU exits.
func (c *TwinCollector) DumpStarted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.send >= 0 {
		unix.Close(c.send)
		c.send = -1
	}
}

// gather reads the plugin's messages as they come (the plugin blocks on a
// full socket), each under the collector's lock, so that sync can tell
// when every message sent so far is in.
func (c *TwinCollector) gather() {
	defer close(c.done)
	buf := make([]byte, twinMsgSize+16)
	oob := make([]byte, unix.CmsgSpace(3*4))
	fd := int(c.recv.Fd())
	for !c.closing.Load() {
		// Not for ever: a copy of the plugin's end that a process
		// started meanwhile inherited would keep the end of the stream
		// from coming.
		if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 50); err != nil && err != unix.EINTR {
			return
		}
		c.mu.Lock()
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			c.mu.Unlock()
			continue
		}
		if err != nil || n == 0 {
			c.mu.Unlock()
			return
		}
		t, track, err := parseTwinMsg(buf[:n], oob[:oobn])
		into := c.got
		if track {
			into = c.tracks
		}
		if err != nil {
			c.errs = append(c.errs, err)
		} else {
			if old := into[t.Pid]; old != nil {
				old.Close()
			}
			into[t.Pid] = t
		}
		c.mu.Unlock()
	}
}

// syncLocked returns, the lock held, once every message queued on the
// socket has been gathered: nothing is queued, and a message is only taken
// off the queue under the lock.
func (c *TwinCollector) syncLocked() {
	for {
		c.mu.Lock()
		n, err := unix.IoctlGetInt(int(c.recv.Fd()), unix.SIOCINQ)
		if err != nil || n == 0 {
			return
		}
		c.mu.Unlock()
		select {
		case <-c.done:
			c.mu.Lock()
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// parseTwinMsg reads one plugin message: a twin, or why there is none; or,
// track set, a process's userfaultfd for write tracking, or why there is
// none (in the Twin's Uffd and TrackErr, with its Pid).
func parseTwinMsg(b, oob []byte) (t *Twin, track bool, err error) {
	var files []int
	if len(oob) > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob)
		if err != nil {
			return nil, false, fmt.Errorf("twin plugin: %w", err)
		}
		for _, m := range msgs {
			if fds, err := unix.ParseUnixRights(&m); err == nil {
				files = append(files, fds...)
			}
		}
	}
	closeFiles := func() {
		for _, fd := range files {
			unix.Close(fd)
		}
	}
	if len(b) < twinMsgSize {
		closeFiles()
		return nil, false, fmt.Errorf("twin plugin: a message of %d bytes, want %d (the plugin and tclone differ: reinstall both)", len(b), twinMsgSize)
	}
	le := binary.LittleEndian
	version := le.Uint32(b)
	pid, twin, errno := int32(le.Uint32(b[4:])), int32(le.Uint32(b[8:])), int32(le.Uint32(b[12:]))
	cloneUs := int32(le.Uint32(b[16:]))
	why := string(b[twinWhyOff : twinWhyOff+twinWhyLen])
	if i := strings.IndexByte(why, 0); i >= 0 {
		why = why[:i]
	}
	if version != twinMsgVersion {
		closeFiles()
		return nil, false, fmt.Errorf("twin plugin speaks version %d, tclone %d: reinstall both", version, twinMsgVersion)
	}
	ns := b[twinWhyOff+twinWhyLen:]
	trackVal, kind := int32(le.Uint32(ns[4+4*twinNSMax:])), int32(le.Uint32(ns[8+4*twinNSMax:]))
	switch {
	case kind == twinKindTrack:
		return parseTrackMsg(int(pid), trackVal, files, closeFiles)
	case kind != twinKindTwin:
		closeFiles()
		return nil, false, fmt.Errorf("twin plugin: a message of kind %d (the plugin and tclone differ: reinstall both)", kind)
	}
	levels := int(int32(le.Uint32(ns)))
	if errno == 0 && (levels < 1 || levels > twinNSMax) {
		closeFiles()
		return nil, false, fmt.Errorf("twin plugin: process %d has %d PID namespace levels, want 1 to %d", pid, levels, twinNSMax)
	}
	var nspid []int
	for i := 0; i < levels && errno == 0; i++ {
		nspid = append(nspid, int(int32(le.Uint32(ns[4+4*i:]))))
	}
	if errno != 0 {
		closeFiles()
		return nil, false, &TwinError{Pid: int(pid), Errno: unix.Errno(errno), Why: why, Killed: int(twin)}
	}
	if len(files) != 2 {
		closeFiles()
		return nil, false, fmt.Errorf("twin plugin: the twin of %d came with %d descriptors, want 2", pid, len(files))
	}
	return &Twin{Pid: int(pid), TwinPid: int(twin), NSpid: nspid,
		Pidfd:    os.NewFile(uintptr(files[0]), fmt.Sprintf("pidfd of twin %d", twin)),
		Lifeline: os.NewFile(uintptr(files[1]), fmt.Sprintf("lifeline of twin %d", twin)),
		Clone:    time.Duration(cloneUs) * time.Microsecond}, false, nil
}

// parseTrackMsg reads a message of the tracking kind: the userfaultfd of
// process pid (track 1), or why it has none (a negated errno).
func parseTrackMsg(pid int, track int32, files []int, closeFiles func()) (*Twin, bool, error) {
	want := 0
	if track == 1 {
		want = 1
	}
	if track == 0 || track > 1 || len(files) != want {
		closeFiles()
		return nil, true, fmt.Errorf("twin plugin: the tracking of %d: %d with %d descriptors (the plugin and tclone differ: reinstall both)", pid, track, len(files))
	}
	t := &Twin{Pid: pid}
	if track == 1 {
		t.Uffd = os.NewFile(uintptr(files[0]), fmt.Sprintf("userfaultfd of process %d", pid))
	} else {
		t.TrackErr = fmt.Errorf("making a userfaultfd in process %d: %w", pid, unix.Errno(-track))
	}
	return t, true, nil
}

// TwinError is a process the plugin could not twin, and why.
type TwinError struct {
	Pid   int
	Errno unix.Errno
	Why   string
	// Killed is the twin the plugin made and then killed, 0 if none.
	// Killed before it named itself, it is a zombie of process Pid's that
	// nothing tells from a child of the process's own: see KilledTwins.
	Killed int
}

func (e *TwinError) Error() string {
	return fmt.Sprintf("no twin of process %d: %s", e.Pid, e.Why)
}

func (e *TwinError) Unwrap() error { return e.Errno }

// Close stops gathering and removes the dump's configuration. It returns
// the twins gathered and not taken (Take), the caller's to release.
func (c *TwinCollector) Close() []*Twin {
	c.DumpStarted()
	if c.recv != nil {
		c.syncLocked()
		c.mu.Unlock()
		c.closing.Store(true)
		<-c.done
		c.recv.Close()
		c.recv = nil
	}
	if c.endDump != nil {
		c.endDump()
		c.endDump = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for pid, t := range c.tracks {
		t.Close()
		delete(c.tracks, pid)
	}
	var left []*Twin
	for pid, t := range c.got {
		left = append(left, t)
		delete(c.got, pid)
	}
	return left
}

// Uffds takes the userfaultfds the plugin handed over (TwinTrackEnv), by
// process pid, and why it could make none for others. The plugin sends
// them right after the clones, before CRIU reaches post-dump.
func (c *TwinCollector) Uffds() (map[int]*os.File, map[int]error) {
	c.syncLocked()
	defer c.mu.Unlock()
	uffds, errs := map[int]*os.File{}, map[int]error{}
	for pid, t := range c.tracks {
		if t.Uffd != nil {
			uffds[pid], t.Uffd = t.Uffd, nil
		} else if t.TrackErr != nil {
			errs[pid] = t.TrackErr
		}
	}
	return uffds, errs
}

// KilledTwins lists the failures the plugin reported with a twin it
// killed (TwinError.Killed), whose zombies are the caller's to reap.
func (c *TwinCollector) KilledTwins() []*TwinError {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*TwinError
	for _, err := range c.errs {
		var te *TwinError
		if errors.As(err, &te) && te.Killed > 0 {
			out = append(out, te)
		}
	}
	return out
}

// Err is the first failure the plugin reported, if any.
func (c *TwinCollector) Err() error {
	if c.recv != nil {
		c.syncLocked()
	} else {
		c.mu.Lock()
	}
	defer c.mu.Unlock()
	return errors.Join(c.errs...)
}

// TwinSnapshots are a twin capture's memory: each process's twin, with its
// /proc/PID/mem open, by image pid.
type TwinSnapshots struct {
	Snapshots
	Twins map[int32]*Twin
}

// List is the twins, for releasing them.
func (s *TwinSnapshots) List() []*Twin {
	var out []*Twin
	for _, t := range s.Twins {
		out = append(out, t)
	}
	return out
}

// giveBack returns the twins to got, by process pid, and closes their
// memory files.
func (s *TwinSnapshots) giveBack(got map[int]*Twin) {
	s.Snapshots.Close()
	for pid, t := range s.Twins {
		got[t.Pid] = t
		delete(s.Twins, pid)
	}
}

// Take hands over the twin of every process with memory in the dump in
// imagesDir, once CRIU has returned: each must have one, alive, whose
// memory it opens. root is the dumped tree's root, here; the images give
// pids as its PID namespace sees them, and each twin came with its
// process's pids at every level, read while CRIU held it. The twins it
// takes are the caller's to release; on failure, those it had taken are
// back with the collector.
func (c *TwinCollector) Take(root int, imagesDir string) (*TwinSnapshots, error) {
	tasks, err := ImageTasks(imagesDir)
	if err != nil {
		return nil, err
	}
	// Every twin was sent before CRIU reached post-dump.
	c.syncLocked()
	defer c.mu.Unlock()
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	rt := c.got[root]
	if rt == nil {
		return nil, fmt.Errorf("the dumped tree's root, process %d, has no twin: CRIU's plugin did not make one", root)
	}
	level := len(rt.NSpid) - 1
	byImagePid := map[int]*Twin{}
	for _, t := range c.got {
		if len(t.NSpid) > level {
			byImagePid[t.NSpid[level]] = t
		}
	}
	s := &TwinSnapshots{Snapshots: Snapshots{Files: map[int32]*os.File{}}, Twins: map[int32]*Twin{}}
	for _, pid := range tasks {
		t := byImagePid[int(pid)]
		if t == nil {
			s.giveBack(c.got)
			return nil, fmt.Errorf("process %d of the images has no twin: CRIU's plugin did not make one", pid)
		}
		mem, err := openTwinMem(t)
		if err != nil {
			s.giveBack(c.got)
			return nil, err
		}
		delete(c.got, t.Pid)
		s.Twins[pid] = t
		s.Files[pid] = mem
		s.Took += t.Clone
	}
	return s, nil
}

// ErrTwinGone is a twin that died before its memory was opened: killed
// after the thaw, by the OOM killer (a twin's oom_score_adj is 1000) or by
// a kill of every process of the container's.
var ErrTwinGone = errors.New("the twin died before its memory was read")

// openTwinMem opens the twin's memory, and proves that the pid named the
// twin all along and that the memory is there: the twin has not exited
// after the open (its pidfd would poll readable, reaped or not: a zombie
// has no memory), and a pid is not reused while its process lives.
func openTwinMem(t *Twin) (*os.File, error) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", t.TwinPid))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("twin %d of process %d: %w (%v)", t.TwinPid, t.Pid, ErrTwinGone, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the memory of twin %d (of process %d): %w", t.TwinPid, t.Pid, err)
	}
	exited, err := procfs.PidfdExited(int(t.Pidfd.Fd()), 0)
	if err != nil {
		mem.Close()
		return nil, fmt.Errorf("twin %d (of process %d): %w", t.TwinPid, t.Pid, err)
	}
	if exited {
		mem.Close()
		return nil, fmt.Errorf("twin %d of process %d: %w", t.TwinPid, t.Pid, ErrTwinGone)
	}
	return mem, nil
}

// madvise flags CRIU records in a VMA's madv (1 << MADV_x).
const (
	madvDontFork   = 1 << 10 // MADV_DONTFORK
	vmaAnonPrivate = 1 << 9  // VMA_ANON_PRIVATE in a VMA's status
)

// CheckTwinnable refuses a twin capture whose memory a twin got wrong: a
// private anonymous area the dump recorded as not copied by fork()
// (MADV_DONTFORK: the twin lacks it). An area fork() wipes
// (MADV_WIPEONFORK) is zeros in the twin, and so in the siblings, as in a
// child of fork(): that is what its owner asked for (glibc's getrandom()
// state, a fork-detection flag), so that a copy never reuses the source's
// secrets. tasks are the dumped tree's, in imagesDir.
func CheckTwinnable(imagesDir string, tasks []Task) error {
	for _, t := range tasks {
		img, err := decodeImage(filepath.Join(imagesDir, fmt.Sprintf("mm-%d.img", t.ImagePid)), &mm.MmEntry{})
		if errors.Is(err, os.ErrNotExist) {
			continue // a zombie: no memory
		}
		if err != nil {
			return err
		}
		if len(img.Entries) != 1 {
			return fmt.Errorf("mm-%d.img holds %d entries, want 1", t.ImagePid, len(img.Entries))
		}
		for _, v := range img.Entries[0].Message.(*mm.MmEntry).GetVmas() {
			if v.GetStatus()&vmaAnonPrivate == 0 {
				continue
			}
			if v.GetMadv()&madvDontFork != 0 {
				return fmt.Errorf("process %d has private memory at %#x-%#x that fork() does not copy (MADV_DONTFORK), which a twin lacks", t.HostPid, v.GetStart(), v.GetEnd())
			}
		}
	}
	return nil
}
