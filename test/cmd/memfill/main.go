// Command memfill is the process the lazy-pages tests dump and restore. It
// fills a private anonymous mapping with a known pattern, writes the hash of
// it, and then answers requests left as files in its directory:
//
//	<dir>/<pid>.req   one command; the answer appears in <dir>/<pid>.resp
//
// where <pid> is its pid as /proc (the host's) sees it, so that siblings
// restored from the same images, each in its own PID namespace, answer
// separately. Commands:
//
//	ping          "pong", without touching the filled memory
//	hash          the hash of the filled memory
//	forkhash      the hash as computed by a child forked for the purpose
//	remap         move the mapping elsewhere (mremap); "ok"
//	dontneed N    discard the first N pages (MADV_DONTNEED); "ok"
//	rewrite       add 1 to every word of the filled memory; the new hash
//	forktime      how long fork(2) of this process takes, in nanoseconds
//	gap           the longest wait between two turns of its 1 ms request
//	              loop since the last gap request, in microseconds: the
//	              longest the process was kept from running (a dump's pause)
//	arm D         arm a storm: "ok"; see below
//	storm         "none" until the storm, then "<start> <gap> <took> <hash>":
//	              when it started (Unix ns), the pause that set it off and
//	              how long it took (ms), and the memory's new hash
//	sigchld       how many SIGCHLD it received
//	dontfork N    mark the first N pages MADV_DONTFORK; "ok"
//	uffd          register the filled memory with a userfaultfd of its
//	              own, which it keeps open; "ok"
//
// Armed with D, the first time its loop finds it was kept from running for
// D or longer (a dump held it) it adds 1 to every word of the filled memory
// at once, as fast as it can: every page is written while a fork's
// copy-on-write capture may still be reading it. A copy of the process in
// another PID namespace (a sibling) does not.
//
// remap and dontneed touch no page of the mapping, so that a lazily restored
// sibling can be made to move and discard memory it is still missing.
//
// With -children N it forks N children right after the fill (fork(2), not
// exec), which only wait: a tree of N+1 tasks with a copy of the memory each.
// It writes where the memory is to <dir>/source.where.
//
// It opens nothing it keeps open and leads its own session, so CRIU dumps it
// with no special options.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/test/pattern"
)

type filled struct {
	mem    []byte
	maxGap time.Duration
	// stormAfter, storm: -storm-after-pause, and its outcome.
	stormAfter time.Duration
	storm      string
	pidns      string
	sigchld    atomic.Int64
	// uffd is a userfaultfd it registered its memory with ("uffd").
	uffd int
}

// original says whether this is the process that filled the memory, not a
// copy of it in another PID namespace.
func (f *filled) original() bool {
	ns, err := os.Readlink("/proc/self/ns/pid")
	return err == nil && ns == f.pidns
}

// rewriteAll adds 1 to every word, as fast as it can, and records the storm.
func (f *filled) rewriteAll(gap time.Duration) {
	start := time.Now()
	w := f.words()
	for i := range w {
		w[i]++
	}
	f.storm = fmt.Sprintf("%d %d %d %s", start.UnixNano(), gap.Milliseconds(), time.Since(start).Milliseconds(), pattern.Format(pattern.Hash(w)))
}

func (f *filled) words() []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&f.mem[0])), len(f.mem)/8)
}

func main() {
	mib := flag.Int("mib", 64, "MiB to fill")
	dir := flag.String("dir", "", "directory for the hash and the requests")
	children := flag.Int("children", 0, "fork this many idle children after the fill, each with a copy of the memory")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "memfill: -dir is required")
		os.Exit(2)
	}
	// Its own session: CRIU refuses a tree whose session leader is outside
	// the tree's PID namespace.
	unix.Setsid()
	mem, err := unix.Mmap(-1, 0, *mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintf(os.Stderr, "memfill: mmap %d MiB: %v\n", *mib, err)
		os.Exit(1)
	}
	f := &filled{mem: mem, storm: "none"}
	f.pidns, _ = os.Readlink("/proc/self/ns/pid")
	chld := make(chan os.Signal, 64)
	signal.Notify(chld, syscall.SIGCHLD)
	go func() {
		for range chld {
			f.sigchld.Add(1)
		}
	}()
	pattern.Fill(f.words())
	for range *children {
		if _, err := rawFork(nil); err != nil {
			fmt.Fprintf(os.Stderr, "memfill: fork: %v\n", err)
			os.Exit(1)
		}
	}
	// Where the memory is, for reading a child's copy through /proc.
	where := fmt.Sprintf("%d %d", uintptr(unsafe.Pointer(&mem[0])), len(mem))
	if err := answer(*dir, "source.where", where); err != nil {
		fmt.Fprintf(os.Stderr, "memfill: %v\n", err)
		os.Exit(1)
	}
	if err := answer(*dir, "source.hash", pattern.Format(pattern.Hash(f.words()))); err != nil {
		fmt.Fprintf(os.Stderr, "memfill: %v\n", err)
		os.Exit(1)
	}
	last := time.Now()
	for {
		time.Sleep(time.Millisecond)
		now := time.Now()
		gap := now.Sub(last)
		f.maxGap = max(f.maxGap, gap)
		if f.stormAfter > 0 && gap >= f.stormAfter && f.storm == "none" && f.original() {
			f.rewriteAll(gap)
			now = time.Now()
		}
		last = now
		f.poll(*dir)
	}
}

func (f *filled) poll(dir string) {
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return
	}
	req := filepath.Join(dir, self+".req")
	cmd, err := os.ReadFile(req)
	if err != nil {
		return
	}
	os.Remove(req)
	if err := answer(dir, self+".resp", f.run(strings.Fields(string(cmd)))); err != nil {
		fmt.Fprintf(os.Stderr, "memfill: %v\n", err)
	}
}

func answer(dir, name, text string) error {
	tmp := filepath.Join(dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

func (f *filled) run(cmd []string) string {
	if len(cmd) == 0 {
		return "error: empty request"
	}
	switch cmd[0] {
	case "ping":
		return "pong"
	case "arm":
		d, err := time.ParseDuration(cmd[len(cmd)-1])
		if err != nil || d <= 0 || len(cmd) != 2 {
			return "error: arm wants a duration"
		}
		f.stormAfter = d
		return "ok"
	case "storm":
		return f.storm
	case "sigchld":
		return strconv.FormatInt(f.sigchld.Load(), 10)
	case "hash":
		return pattern.Format(pattern.Hash(f.words()))
	case "forkhash":
		return f.forkHash()
	case "remap":
		if err := f.remap(); err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	case "gap":
		g := f.maxGap
		f.maxGap = 0
		return strconv.FormatInt(g.Microseconds(), 10)
	case "forktime":
		start := time.Now()
		pid, err := rawFork(exitJob)
		took := time.Since(start)
		if err != nil {
			return "error: fork: " + err.Error()
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
		return strconv.FormatInt(took.Nanoseconds(), 10)
	case "rewrite":
		w := f.words()
		for i := range w {
			w[i]++
		}
		return pattern.Format(pattern.Hash(w))
	case "dontfork":
		n, err := strconv.Atoi(cmd[len(cmd)-1])
		if err != nil || n*4096 > len(f.mem) {
			return "error: dontfork wants a page count within the mapping"
		}
		if err := unix.Madvise(f.mem[:n*4096], unix.MADV_DONTFORK); err != nil {
			return "error: madvise: " + err.Error()
		}
		return "ok"
	case "uffd":
		if err := f.registerUffd(); err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	case "dontneed":
		n, err := strconv.Atoi(cmd[len(cmd)-1])
		if err != nil || n*4096 > len(f.mem) {
			return "error: dontneed wants a page count within the mapping"
		}
		if err := unix.Madvise(f.mem[:n*4096], unix.MADV_DONTNEED); err != nil {
			return "error: madvise: " + err.Error()
		}
		return "ok"
	}
	return "error: unknown request " + cmd[0]
}

// remap moves the mapping to a fresh address, so that a lazily restored
// task's missing pages have to follow it.
func (f *filled) remap() error {
	size := len(f.mem)
	dst, err := unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	to, err := unix.MremapPtr(unsafe.Pointer(&f.mem[0]), uintptr(size), unsafe.Pointer(&dst[0]), uintptr(size),
		unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED)
	if err != nil {
		return fmt.Errorf("mremap: %w", err)
	}
	f.mem = unsafe.Slice((*byte)(to), size)
	return nil
}

// forkHash hashes the memory in a child made by fork(2) itself (not
// fork+exec), so that the child inherits the lazily restored mapping and its
// missing pages reach the lazy-pages daemon through the child's own
// userfaultfd.
func (f *filled) forkHash() string {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return "error: pipe: " + err.Error()
	}
	words := f.words()
	job := &hashJob{base: unsafe.Pointer(&words[0]), n: uint64(len(words)), out: uintptr(p[1])}
	pid, err := rawFork(job)
	unix.Close(p[1])
	if err != nil {
		unix.Close(p[0])
		return "error: fork: " + err.Error()
	}
	out := os.NewFile(uintptr(p[0]), "hash pipe")
	defer out.Close()
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, 0, nil)
	if n != 16 || !ws.Exited() || ws.ExitStatus() != 0 {
		return fmt.Sprintf("error: child answered %q, %v", buf[:n], ws)
	}
	return string(buf[:n])
}

// registerUffd registers the filled memory with a userfaultfd of its own,
// in missing mode (every page is present: nothing ever faults), and keeps
// it open: a process that uses userfaultfd itself.
func (f *filled) registerUffd() error {
	const userModeOnly = 1 // UFFD_USER_MODE_ONLY: no privilege needed
	fd, _, errno := syscall.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|userModeOnly, 0, 0)
	if errno != 0 {
		return fmt.Errorf("userfaultfd: %w", errno)
	}
	api := struct{ api, features, ioctls uint64 }{api: 0xaa}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, 0xc018aa3f, uintptr(unsafe.Pointer(&api))); e != 0 {
		return fmt.Errorf("UFFDIO_API: %w", e)
	}
	reg := struct{ start, len, mode, ioctls uint64 }{start: uint64(uintptr(unsafe.Pointer(&f.mem[0]))), len: uint64(len(f.mem)), mode: 1}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, 0xc020aa00, uintptr(unsafe.Pointer(&reg))); e != 0 {
		return fmt.Errorf("UFFDIO_REGISTER: %w", e)
	}
	f.uffd = int(fd)
	return nil
}
