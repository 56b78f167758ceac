package lazypages

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/kernel/cherrypick"
)

// EventKind names what happened to a sibling.
type EventKind string

// Events, in the order a sibling goes through them.
const (
	EventConnected EventKind = "connected" // a restore connected
	EventTask      EventKind = "task"      // a task's userfaultfd arrived
	EventRunning   EventKind = "running"   // the restore finished; its tasks run while they fill
	EventShared    EventKind = "shared"    // Share gave the sibling the snapshots' pages (Event.Share)
	EventComplete  EventKind = "complete"  // every page is in place; the daemon is done with it
	EventFailed    EventKind = "failed"    // its memory could not be completed; its tasks were killed
	// EventDrainFailed is no sibling's: the snapshots could not be drained
	// (Options.Drain); siblings still read them.
	EventDrainFailed EventKind = "drain-failed"
)

// Event is one step of a sibling.
type Event struct {
	Kind    EventKind `json:"kind"`
	Sibling int       `json:"sibling"`
	// Socket is where the sibling's restore connected (the Listen path),
	// which tells siblings apart when each restore has its own work
	// directory.
	Socket string `json:"socket,omitempty"`
	// Pid and ImagePid name the task of an EventTask: its host pid and its
	// pid in the images.
	Pid      int         `json:"pid,omitempty"`
	ImagePid int32       `json:"image_pid,omitempty"`
	Err      error       `json:"-"`
	Stats    *Stats      `json:"stats,omitempty"`
	Share    *ShareStats `json:"share,omitempty"`
}

// Options configure a Daemon.
type Options struct {
	// ImagesDir is the dump every sibling is restored from.
	ImagesDir string
	// Snapshots, if set, hold the dump's memory instead of its pages
	// images: for each task (by its pid in the images), a vma_cherrypick
	// snapshot taken while the dump held the tree frozen. Lazy pages are
	// then read from the snapshot at their addresses, and the dump may be a
	// --lazy-pages one, whose images hold none of them. The daemon reads
	// the files and never closes them.
	Snapshots map[int32]*os.File
	// ShareWait, with Snapshots, has each task wait this long after
	// restore-finished for Share (see share.go) before it copies anything
	// in the background; 0 copies every page, sharing none.
	ShareWait time.Duration
	// SharePause, if set, is a wait between unregistering an area and
	// sharing it: it lets tests kill the daemon while an area has neither
	// its userfaultfd nor its pages.
	SharePause time.Duration
	// OnEvent, if set, is called for every event, from the daemon's
	// goroutines; it must not block for long.
	OnEvent func(Event)
	// ChunkPause, if set, is a wait between two background chunks of one
	// task (faults are still answered at once): it leaves CPU to the
	// siblings, and lets tests catch a sibling while it fills.
	ChunkPause time.Duration
	// Drain, with Snapshots, copies them into page images of the dump's
	// own at once and releases each as soon as it is done with (twins:
	// see drain.go).
	Drain *Drain
}

// Daemon is one lazy-pages daemon: it serves any number of siblings
// restored from one dump, one restore connection each.
type Daemon struct {
	opts   Options
	images *Images
	slots  *fillSlots
	guard  *guard
	// dev shares snapshots' pages (Options.ShareWait); nil otherwise.
	dev *cherrypick.Device
	// stopDrain ends draining early; drained closes when it has ended.
	stopDrain, drained chan struct{}

	mu        sync.Mutex
	listeners []*net.UnixListener
	paths     []string        // of listeners
	copying   map[string]bool // paths whose siblings get copies, not shares
	siblings  map[int]*sibling
	nextID    int
	closing   bool
	conns     sync.WaitGroup
	live      sync.WaitGroup // siblings not reported yet
}

// Start starts a daemon for the dump in opts.ImagesDir, with its guard
// process. It accepts restores once Listen is called.
func Start(opts Options) (*Daemon, error) {
	images, err := OpenImages(opts.ImagesDir)
	if err != nil {
		return nil, err
	}
	images.snapshots = opts.Snapshots
	if opts.Drain != nil {
		images.drainRelease = opts.Drain.Release
	}
	d := &Daemon{opts: opts, images: images, siblings: map[int]*sibling{}, slots: newFillSlots(defaultFillSlots()),
		stopDrain: make(chan struct{}), drained: make(chan struct{})}
	if opts.Snapshots != nil && opts.ShareWait > 0 {
		if d.dev, err = cherrypick.Open(); err != nil {
			images.Close()
			return nil, fmt.Errorf("lazy pages: sharing snapshots' pages: %w", err)
		}
	}
	if d.guard, err = startGuard(d.guardLost); err != nil {
		images.Close()
		if d.dev != nil {
			d.dev.Close()
		}
		return nil, err
	}
	if opts.Drain != nil && opts.Snapshots != nil {
		go func() {
			defer close(d.drained)
			if err := images.drain(opts.Drain, d.stopDrain); err != nil {
				d.emit(Event{Kind: EventDrainFailed, Err: err})
			}
		}()
	} else {
		close(d.drained)
	}
	return d, nil
}

// WaitDrained waits until the snapshots are drained into page images
// (Options.Drain), or draining failed.
func (d *Daemon) WaitDrained() (DrainState, error) { return d.images.WaitDrained() }

// Drained says how far draining has got.
func (d *Daemon) Drained() DrainState { return d.images.Drained() }

func (d *Daemon) emit(ev Event) {
	if d.opts.OnEvent != nil {
		d.opts.OnEvent(ev)
	}
}

// guardLost fails every sibling still filling: without a guard, a death of
// the daemon would leave them reading zeros.
func (d *Daemon) guardLost(err error) {
	d.mu.Lock()
	var open []*sibling
	for _, s := range d.siblings {
		open = append(open, s)
	}
	d.mu.Unlock()
	for _, s := range open {
		s.fail(err)
	}
}

// Listen accepts restores on a unix socket at path: the lazy-pages.socket
// of a restore's work directory. A daemon may listen at several paths, one
// per work directory.
func (d *Daemon) Listen(path string) error { return d.listen(path, false) }

// ListenCopying is Listen for siblings that get copies of the snapshots'
// pages, never the pages themselves, whatever Options.ShareWait says: they
// fill at once, with no Share to wait for.
func (d *Daemon) ListenCopying(path string) error { return d.listen(path, true) }

func (d *Daemon) listen(path string, copying bool) error {
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	fd, err := socketFD(l)
	if err == nil {
		err = d.guard.arm(guardArmListener, fd)
	}
	if err != nil {
		l.Close()
		return err
	}
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		d.guard.disarm(guardDisarmListener, fd)
		l.Close()
		return errors.New("lazy pages: daemon is closing")
	}
	d.listeners = append(d.listeners, l)
	d.paths = append(d.paths, path)
	if copying {
		if d.copying == nil {
			d.copying = map[string]bool{}
		}
		d.copying[path] = true
	}
	d.conns.Add(1)
	d.mu.Unlock()
	go d.accept(l, path)
	return nil
}

// listenUnix binds path, replacing a stale socket as CRIU's daemon does. A
// path too long for sockaddr_un is bound through its directory's
// /proc/self/fd link.
func listenUnix(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lazy pages: remove stale %s: %w", path, err)
	}
	bind := path
	if len(path) >= len(unix.RawSockaddrUnix{}.Path) {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("lazy pages: %w", err)
		}
		defer dir.Close()
		bind = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: bind, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("lazy pages: listen on %s: %w", path, err)
	}
	// Every message must name its sender, the task to kill if its memory
	// cannot be completed. The kernel names senders to a connection not
	// yet accepted, and an accepted one takes SO_PASSCRED from its
	// listener at once; set on the accepted socket instead, it would leave
	// messages sent in between nameless, and their tasks out of reach.
	if err := setPassCred(l); err != nil {
		l.Close()
		return nil, fmt.Errorf("lazy pages: SO_PASSCRED on %s: %w", path, err)
	}
	if bind != path {
		// The name to unlink on close would be the /proc path.
		l.SetUnlinkOnClose(false)
	}
	return l, nil
}

func setPassCred(c interface {
	SyscallConn() (syscall.RawConn, error)
}) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	return serr
}

func socketFD(c interface {
	SyscallConn() (syscall.RawConn, error)
}) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	raw.Control(func(f uintptr) { fd = int(f) })
	return fd, nil
}

func (d *Daemon) accept(l *net.UnixListener, path string) {
	defer d.conns.Done()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		d.conns.Add(1)
		go d.serveConn(c, path)
	}
}

func (d *Daemon) newSibling(socket string) *sibling {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	s := &sibling{id: d.nextID, d: d, socket: socket, uffds: map[*uffd]bool{}, restore: -1, shareExpired: make(chan struct{}),
		copying: d.copying[socket]}
	s.stats.Connected = time.Now()
	d.siblings[s.id] = s
	d.live.Add(1)
	if d.closing {
		// Killed before it has any task: each task that arrives is killed
		// before its userfaultfd is read (sibling.arm).
		s.state.Store(int32(abandoned))
		s.failure = errors.New("lazy pages: the daemon is closing")
		s.killed = true
	}
	return s
}

func (d *Daemon) siblingDone(s *sibling, ev Event) {
	d.mu.Lock()
	delete(d.siblings, s.id)
	d.mu.Unlock()
	d.emit(ev)
	d.live.Done()
}

// serveConn reads one restore's messages. The connection is armed in the
// guard for as long as it may hold unread messages.
func (d *Daemon) serveConn(c *net.UnixConn, socket string) {
	defer d.conns.Done()
	defer c.Close()
	s := d.newSibling(socket)
	d.emit(Event{Kind: EventConnected, Sibling: s.id, Socket: socket})
	fd, err := socketFD(c)
	if err == nil {
		err = d.guard.arm(guardArmConn, fd)
	}
	if err != nil {
		s.fail(err)
		s.maybeDone()
		return
	}
	defer d.guard.disarm(guardDisarmConn, fd)
	if err := s.watchRestore(fd); err != nil {
		s.fail(err)
		s.maybeDone()
		return
	}
	if err := d.readRestore(c, s); err != nil {
		s.connectionLost(err)
	}
	s.maybeDone()
}

func (d *Daemon) readRestore(c *net.UnixConn, s *sibling) error {
	cc, err := newCriuConn(c)
	if err != nil {
		return err
	}
	for {
		msg, err := cc.next()
		if errors.Is(err, io.EOF) {
			return errors.New("CRIU closed the connection")
		}
		if err != nil {
			return err
		}
		switch msg.kind {
		case msgFinished:
			s.restored()
			return nil
		case msgTask:
			if err := s.addTask(cc, msg); err != nil {
				s.fail(err)
				if errors.Is(err, errStream) {
					return err
				}
			}
		}
	}
}

// Wait returns once every sibling that connected so far is complete or
// failed.
func (d *Daemon) Wait() { d.live.Wait() }

// Close stops the daemon. Siblings still filling are killed: once the
// daemon is gone their memory could never be completed.
func (d *Daemon) Close() error {
	d.mu.Lock()
	d.closing = true
	listeners, paths := d.listeners, d.paths
	d.mu.Unlock()
	for i, l := range listeners {
		d.refuse(l, paths[i])
	}
	d.mu.Lock()
	var open []*sibling
	for _, s := range d.siblings {
		open = append(open, s)
	}
	d.mu.Unlock()
	for _, s := range open {
		s.fail(errors.New("lazy pages: the daemon was closed before the sibling's memory was complete"))
	}
	d.conns.Wait()
	d.live.Wait()
	close(d.stopDrain)
	<-d.drained
	// Nothing reads a snapshot any more.
	d.images.releaseSnapshots()
	var errs []error
	for _, l := range listeners {
		if fd, err := socketFD(l); err == nil {
			d.guard.disarm(guardDisarmListener, fd)
		}
		errs = append(errs, l.Close())
	}
	errs = append(errs, d.guard.close(), d.images.Close())
	if d.dev != nil {
		errs = append(errs, d.dev.Close())
	}
	return errors.Join(errs...)
}

// refuse stops l from taking new restores and takes over those that
// connected already: closing a listener with restores in its backlog would
// drop their userfaultfds, in flight there, and leave their tasks reading
// zeros. They are served as siblings of a closing daemon, which kills them.
func (d *Daemon) refuse(l *net.UnixListener, path string) {
	raw, err := l.SyscallConn()
	if err != nil {
		return
	}
	var pending []int
	raw.Control(func(fd uintptr) {
		unix.Shutdown(int(fd), unix.SHUT_RD)
		for {
			c, _, err := unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if err != nil {
				return
			}
			pending = append(pending, c)
		}
	})
	l.SetDeadline(time.Now())
	for _, fd := range pending {
		f := os.NewFile(uintptr(fd), "lazy-pages connection")
		c, err := net.FileConn(f)
		f.Close()
		if uc, ok := c.(*net.UnixConn); err == nil && ok {
			d.conns.Add(1)
			go d.serveConn(uc, path)
		}
	}
}
