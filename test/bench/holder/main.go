// Command holder is the benchmark's in-container workload, and its host-side
// helper for the CRIU and fork() baselines.
//
//	holder serve [--procs N] [--mem-mib M] [--children holder|sleep] [--report PATH] [--setsid] [--dirty-kib K] [--write]
//	holder child --mem-kib K                 (started by serve, not by hand)
//	holder forkfloor --mem-mib M [--reps R] [--rewrite]  (prints JSON)
//
// serve is the root of a process tree of N processes (itself included) that
// together hold M MiB of touched, private anonymous memory, split evenly
// between them. Children are either holder processes (each touching its
// share) or, for the process-count sweep, the smallest process there is:
// busybox `sleep`. The root runs a 1 ms ticker and records the largest gap
// between two ticks, which is how long the process could not run (a frozen
// source shows up as one long gap). A copy of the tree in another PID
// namespace than the one the root started in (a tclone sibling, a stock
// Podman restore) stops ticking: nothing reads a copy's gaps, and on a small
// machine a dozen copies' tickers would take the CPU the next fork is
// measured on. On
// SIGUSR1 it writes its report (JSON) to --report, atomically, then resets
// the largest gap; on SIGUSR2 it first
// writes --dirty-kib of its memory anew. The first report is
// written once every child has touched its memory: it is the ready marker.
//
// With --write the root is a write-heavy program: one more locked thread
// rewrites the root's share of the memory, whole page after whole page,
// round and round, as fast as it can, and the report carries how many
// pages it wrote in each 10 ms (holderreport.WriteBucket). That is how the
// source's speed after a fork is measured: right after a copy-on-write
// capture every first write of a page copies it. Like the ticker, the
// writer stops in a copy of the tree.
//
// No sockets, no locks, no open files beyond stdio: the tree is all memory,
// processes and threads, so the benchmark measures those and nothing else.
//
// forkfloor touches M MiB in one process and times raw fork() calls of it
// (the child exits at once): the physical floor of a copy-on-write copy of
// that much memory. With --rewrite it then times rewriting all of that
// memory, a whole page at a time, twice: right after one more fork() (the
// child gone, so every first write only takes back its page, trapping
// once) and again (no trap): what a write-heavy program pays after any
// fork() of it.
//
// Build it static, it runs in a busybox image:
//
//	CGO_ENABLED=0 go build -o holder ./holder    # in test/bench
//
//go:debug containermaxprocs=0
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tclone/tclone/test/bench/internal/holderreport"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: holder serve|child|forkfloor [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "child":
		err = child(os.Args[2:])
	case "forkfloor":
		err = forkFloor(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "holder %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// touch maps kib KiB of private anonymous memory and writes every byte of
// it with a pseudo-random stream, so every page is present, dirty and
// different. The mapping is never unmapped.
func touch(kib int64, seed uint64) ([]byte, error) {
	if kib <= 0 {
		return nil, nil
	}
	size := int(kib * 1024)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d KiB: %w", kib, err)
	}
	fill(mem, seed)
	return mem, nil
}

// fill writes mem with the pseudo-random stream of seed.
func fill(mem []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := 0; i+8 <= len(mem); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(mem[i:], x)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	procs := fs.Int("procs", 1, "processes in the tree, this one included")
	memMiB := fs.Int("mem-mib", 0, "MiB of touched anonymous memory, split evenly between the processes")
	kind := fs.String("children", "holder", "children: holder (touch their share) or sleep (busybox sleep, no memory)")
	sleepBin := fs.String("sleep-bin", "/bin/sleep", "sleep binary for --children sleep")
	report := fs.String("report", holderreport.Path, "report file, written at ready and on SIGUSR1")
	setsid := fs.Bool("setsid", false, "start a new session first (for a tree started from a shell)")
	dirty := fs.Int64("dirty-kib", 0, "on SIGUSR2, write this many KiB of its own memory anew (from its middle), then the report")
	writes := fs.Bool("write", false, "rewrite the root's memory continuously and report the pages written per 10 ms")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *procs < 1 || *memMiB < 0 {
		return fmt.Errorf("--procs must be >= 1 and --mem-mib >= 0")
	}
	if *kind != "holder" && *kind != "sleep" {
		return fmt.Errorf("--children must be holder or sleep")
	}
	start := time.Now()
	if *setsid {
		unix.Setsid()
	}
	// Registered before any child exists, so that no exit goes unreaped.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)

	var maxGap, ticks atomic.Int64
	ns := pidNamespace()
	go func() {
		// One locked thread that sleeps 1 ms at a time: a tick that comes
		// late shows how long the process could not run.
		runtime.LockOSThread()
		last := time.Now()
		for n := 1; ; n++ {
			if n%128 == 0 && pidNamespace() != ns {
				return // a copy: see the package comment
			}
			time.Sleep(time.Millisecond)
			now := time.Now()
			gap := int64(now.Sub(last))
			last = now
			ticks.Add(1)
			for {
				cur := maxGap.Load()
				if gap <= cur || maxGap.CompareAndSwap(cur, gap) {
					break
				}
			}
		}
	}()

	totalKiB := int64(*memMiB) * 1024
	share := totalKiB / int64(*procs)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Children report having touched their memory by writing one byte to
	// a pipe; the pipe is closed before the tree is ready, so the captured
	// tree holds no pipe.
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	for i := 1; i < *procs; i++ {
		var argv []string
		bin := exe
		if *kind == "sleep" {
			bin = *sleepBin
			argv = []string{"sleep", "2147483647"}
		} else {
			argv = []string{"holder", "child", "--mem-kib", strconv.FormatInt(share, 10), "--seed", strconv.Itoa(i + 1)}
		}
		attr := &syscall.ProcAttr{Files: []uintptr{os.Stdin.Fd(), os.Stdout.Fd(), os.Stderr.Fd(), w.Fd()}}
		if _, err := syscall.ForkExec(bin, argv, attr); err != nil {
			return fmt.Errorf("start child %d (%s): %w", i, bin, err)
		}
	}
	w.Close()
	mem, err := touch(share, 1)
	if err != nil {
		return err
	}
	if *kind == "holder" {
		buf := make([]byte, 1)
		for i := 1; i < *procs; i++ {
			if _, err := r.Read(buf); err != nil {
				return fmt.Errorf("waiting for child %d of %d to touch its memory: %w", i, *procs-1, err)
			}
		}
	}
	r.Close()
	var wr *writer
	if *writes {
		if len(mem) == 0 {
			return fmt.Errorf("--write needs memory to write: give --mem-mib")
		}
		wr = &writer{mem: mem}
		go wr.run(ns)
	}

	var seq int64
	write := func() error {
		rep := holderreport.Report{
			Seq: seq, Pid: os.Getpid(), Procs: *procs, MemKiB: totalKiB,
			MaxGapMs: float64(maxGap.Swap(0)) / 1e6, Ticks: ticks.Load(),
			ReadyMs: float64(time.Since(start).Microseconds()) / 1000,
		}
		if wr != nil {
			rep.Writes = wr.take()
		}
		seq++
		b, _ := json.Marshal(rep)
		tmp := *report + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, *report)
	}
	if err := os.MkdirAll(filepath.Dir(*report), 0o755); err != nil {
		return err
	}
	if err := write(); err != nil {
		return fmt.Errorf("write ready report: %w", err)
	}
	for sig := range sigs {
		switch sig {
		case syscall.SIGUSR1:
			if err := write(); err != nil {
				fmt.Fprintf(os.Stderr, "holder: report: %v\n", err)
			}
		case syscall.SIGUSR2:
			// A workspace that changed a little: the same pages, new
			// contents each time.
			n := min(int(*dirty*1024), len(mem))
			from := (len(mem) - n) / 2 &^ 4095
			fill(mem[from:from+n], uint64(100+seq))
			if err := write(); err != nil {
				fmt.Fprintf(os.Stderr, "holder: report: %v\n", err)
			}
		case syscall.SIGCHLD:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		default:
			return nil
		}
	}
	return nil
}

// writer is serve --write's write-heavy thread.
type writer struct {
	mem []byte
	mu  sync.Mutex
	out []holderreport.WriteBucket
}

// writerBuckets bounds the buckets kept between two reports: a minute.
const writerBuckets = 6000

// run rewrites w.mem page by page until the process turns out to be a copy
// (its PID namespace is not ns). It looks at the clock every 16 pages.
func (w *writer) run(ns string) {
	runtime.LockOSThread()
	var page [2][4096]byte
	for i := range page[1] {
		page[1][i] = 0xa5
	}
	b := holderreport.WriteBucket{StartNs: time.Now().UnixNano()}
	for pass := 0; ; pass++ {
		src := page[pass%2][:]
		for off := 0; off+4096 <= len(w.mem); off += 4096 {
			copy(w.mem[off:off+4096], src)
			b.Pages++
			if b.Pages%16 != 0 {
				continue
			}
			now := time.Now().UnixNano()
			if now-b.StartNs < int64(10*time.Millisecond) {
				continue
			}
			b.EndNs = now
			w.mu.Lock()
			if len(w.out) >= writerBuckets {
				w.out = w.out[1:]
			}
			w.out = append(w.out, b)
			w.mu.Unlock()
			b = holderreport.WriteBucket{StartNs: now}
			if pidNamespace() != ns {
				return // a copy: see the package comment
			}
		}
	}
}

// take returns the buckets since the last call.
func (w *writer) take() []holderreport.WriteBucket {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.out
	w.out = nil
	return out
}

func child(args []string) error {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	kib := fs.Int64("mem-kib", 0, "KiB to touch")
	seed := fs.Uint64("seed", 2, "content seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := touch(*kib, *seed); err != nil {
		return err
	}
	ready := os.NewFile(3, "ready")
	ready.Write([]byte{1})
	ready.Close()
	signal.Ignore(syscall.SIGUSR1)
	for {
		time.Sleep(time.Hour)
	}
}

// rawFork forks the calling thread; the child exits at once. It must not
// grow the stack or call into the runtime between fork and exit, hence
// nosplit and raw system calls only.
//
//go:nosplit
//go:norace
func rawFork() (uintptr, syscall.Errno) {
	pid, _, errno := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	if pid == 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
	return pid, 0
}

// rewriteAll writes every whole page of mem with the byte b, as serve's
// writer does, and returns how long that took, ms.
func rewriteAll(mem []byte, b byte) float64 {
	var page [4096]byte
	for i := range page {
		page[i] = b
	}
	start := time.Now()
	for off := 0; off+4096 <= len(mem); off += 4096 {
		copy(mem[off:off+4096], page[:])
	}
	return float64(time.Since(start).Microseconds()) / 1000
}

// FloorResult is forkfloor's output.
type FloorResult struct {
	MemMiB  int       `json:"mem_mib"`
	RssKiB  int64     `json:"rss_kib"`
	ForkMs  []float64 `json:"fork_ms"`
	TouchMs float64   `json:"touch_ms"`
	// MedianMs is the median of ForkMs (the mean of the middle two for an
	// even count).
	MedianMs float64 `json:"median_ms"`
	// RewriteAfterForkMs and RewriteMs are --rewrite's two rewrites.
	RewriteAfterForkMs float64 `json:"rewrite_after_fork_ms,omitempty"`
	RewriteMs          float64 `json:"rewrite_ms,omitempty"`
}

func forkFloor(args []string) error {
	fs := flag.NewFlagSet("forkfloor", flag.ContinueOnError)
	memMiB := fs.Int("mem-mib", 0, "MiB of touched memory in the forked process")
	reps := fs.Int("reps", 5, "number of forks timed")
	rewrite := fs.Bool("rewrite", false, "then time rewriting all the memory after one more fork(), and again")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t := time.Now()
	mem, err := touch(int64(*memMiB)*1024, 7)
	if err != nil {
		return err
	}
	res := FloorResult{MemMiB: *memMiB, TouchMs: float64(time.Since(t).Microseconds()) / 1000}
	runtime.LockOSThread()
	for i := 0; i < *reps; i++ {
		start := time.Now()
		pid, errno := rawFork()
		d := time.Since(start)
		if errno != 0 {
			return fmt.Errorf("fork: %v", errno)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(int(pid), &ws, 0, nil); err != nil {
			return fmt.Errorf("wait for %d: %w", pid, err)
		}
		res.ForkMs = append(res.ForkMs, float64(d.Nanoseconds())/1e6)
	}
	if b, err := os.ReadFile("/proc/self/smaps_rollup"); err == nil {
		res.RssKiB = rollupField(string(b), "Rss:")
	}
	res.MedianMs = median(res.ForkMs)
	if *rewrite {
		pid, errno := rawFork()
		if errno != 0 {
			return fmt.Errorf("fork: %v", errno)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(int(pid), &ws, 0, nil); err != nil {
			return fmt.Errorf("wait for %d: %w", pid, err)
		}
		res.RewriteAfterForkMs = rewriteAll(mem, 1)
		res.RewriteMs = rewriteAll(mem, 2)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// median is the middle value of v (the mean of the middle two for an even
// count), 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func rollupField(s, name string) int64 {
	for _, line := range strings.Split(s, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}

// pidNamespace names the PID namespace the process is in: a restored copy
// runs in a new one, under the same PIDs.
func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}
