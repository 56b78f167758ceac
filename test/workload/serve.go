package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// serveConfig is serve's command line. Paths are absolute once validated:
// serve changes into the state directory, and relative paths would change
// meaning.
type serveConfig struct {
	stateDir   string
	memMiB     int
	memSeed    uint64
	tcpPort    int
	unixSocket string
	control    string
}

// Periods of serve's background activity.
const (
	counterPeriod     = 10 * time.Millisecond
	counterFilePeriod = 100 * time.Millisecond
	gapPeriod         = time.Millisecond
	// tickWindow is the least time between the two samples a report takes
	// to tell whether the timerfd and the counter threads still tick.
	tickWindow = 100 * time.Millisecond
	// counterThreadCount is the number of locked counter threads.
	counterThreadCount = 4
)

func cmdServe(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg serveConfig
	fs.StringVar(&cfg.stateDir, "state-dir", defaultStateDir, "directory for serve's files (created if missing)")
	fs.IntVar(&cfg.memMiB, "mem-mib", defaultMemMiB, "size of the anonymous memory region in MiB")
	fs.Uint64Var(&cfg.memSeed, "mem-seed", defaultMemSeed, "seed of the memory region's pseudo-random content")
	fs.IntVar(&cfg.tcpPort, "tcp-port", defaultTCPPort, "TCP port to listen on (0: any free port, reported as tcp_port)")
	fs.StringVar(&cfg.unixSocket, "unix-socket", defaultUnixSocket, "path of the listening unix echo socket")
	fs.StringVar(&cfg.control, "control", defaultControl, "path of the control socket")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log.SetOutput(stderr)
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix(fmt.Sprintf("workload serve[%d]: ", os.Getpid()))

	// Registered before any child exists so that no exit goes unnoticed.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)

	s, err := startServer(cfg)
	if err != nil {
		return err
	}
	s.tree.reapChildren()
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			s.tree.reapChildren()
			continue
		}
		// Handled explicitly because as a container's PID 1 the kernel
		// would not apply SIGTERM's default action.
		log.Printf("exiting on %v", sig)
		return nil
	}
	return nil
}

func (c *serveConfig) validate() error {
	if c.memMiB < 1 || c.memMiB > 1<<20 {
		return usagef("--mem-mib must be between 1 and %d, got %d", 1<<20, c.memMiB)
	}
	if c.tcpPort < 0 || c.tcpPort > 65535 {
		return usagef("--tcp-port must be between 0 and 65535, got %d", c.tcpPort)
	}
	for _, p := range []*string{&c.stateDir, &c.unixSocket, &c.control} {
		if *p == "" {
			return usagef("--state-dir, --unix-socket and --control must not be empty")
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}

// server is serve's state. Everything in it lives as long as the process.
type server struct {
	cfg     serveConfig
	tree    *processTree
	threads *counterThreads
	timer   *tickTimer
	events  *eventLoop
	files   openFiles
	locks   *heldLocks
	mem     *memRegion
	tag     *tagPage
	tcpPort int // the port actually bound, which differs from cfg's for 0

	counter  atomic.Int64
	maxGapNs atomic.Int64

	opMu sync.Mutex // one control operation at a time, so reports are coherent
}

// startServer sets everything up and writes the ready marker.
func startServer(cfg serveConfig) (*server, error) {
	start := time.Now()
	s := &server{cfg: cfg}
	dir := cfg.stateDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	if err := os.Chdir(dir); err != nil {
		return nil, fmt.Errorf("enter state directory: %w", err)
	}
	// Locks first: they tell whether another serve uses this directory,
	// before anything in it is touched.
	var err error
	if s.locks, err = takeLocks(dir); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dir, readyFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale ready marker: %w", err)
	}
	// A fresh mark per start, inherited by the children.
	if err := os.Setenv(markEnv, randomHex(8)); err != nil {
		return nil, fmt.Errorf("set %s: %w", markEnv, err)
	}

	memStart := time.Now()
	if s.mem, err = newMemRegion(cfg.memMiB, cfg.memSeed); err != nil {
		return nil, err
	}
	memTime := time.Since(memStart)
	if s.tag, err = newTagPage("initial"); err != nil {
		return nil, err
	}

	if s.files.offset, err = openOffsetFile(dir); err != nil {
		return nil, fmt.Errorf("offset file: %w", err)
	}
	s.files.deletedPath = filepath.Join(dir, deletedFileName)
	if s.files.deleted, s.files.deletedSum, err = openDeletedFile(dir); err != nil {
		return nil, fmt.Errorf("deleted file: %w", err)
	}

	if s.threads, err = startCounterThreads(counterThreadCount); err != nil {
		return nil, err
	}
	if s.timer, err = startTimer(); err != nil {
		return nil, err
	}
	if s.events, err = startEventLoop(); err != nil {
		return nil, err
	}

	go s.countForever()
	// The first write is synchronous so that the file exists once ready.
	counterPath := filepath.Join(dir, counterFileName)
	if err := writeFileAtomic(counterPath, []byte("0")); err != nil {
		return nil, fmt.Errorf("write counter file: %w", err)
	}
	go s.writeCounterFileForever(counterPath)
	go s.measureGapsForever()

	if s.tree, err = startProcessTree(); err != nil {
		return nil, err
	}

	echoLn, err := listenUnix(cfg.unixSocket)
	if err != nil {
		return nil, err
	}
	go serveForever(echoLn, "unix echo", serveEcho)
	// Plain TCP: since Go 1.24 listeners default to MPTCP where the kernel
	// has it, and CRIU cannot dump MPTCP sockets ("Unsupported proto 262").
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	tcpLn, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("0.0.0.0:%d", cfg.tcpPort))
	if err != nil {
		return nil, fmt.Errorf("listen on TCP port %d: %w", cfg.tcpPort, err)
	}
	s.tcpPort = tcpLn.Addr().(*net.TCPAddr).Port
	go serveForever(tcpLn, "tcp", s.serveTCP)
	controlLn, err := listenUnix(cfg.control)
	if err != nil {
		return nil, err
	}
	go serveForever(controlLn, "control", s.serveControl)

	pid := strconv.Itoa(os.Getpid())
	if err := writeFileAtomic(filepath.Join(dir, readyFileName), []byte(pid)); err != nil {
		return nil, fmt.Errorf("write ready marker: %w", err)
	}
	log.Printf("ready in %v (%d MiB filled in %v); state in %s, control socket %s, TCP port %d",
		time.Since(start).Round(time.Millisecond), cfg.memMiB, memTime.Round(time.Millisecond),
		dir, cfg.control, s.tcpPort)
	return s, nil
}

// listenUnix listens on a unix stream socket at path, replacing a stale
// socket file left by an earlier run.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, nil
}

// serveForever accepts connections and handles each on its own goroutine.
// Accept errors (such as running out of fds) are logged and retried: serve
// must outlive transient trouble.
func serveForever(ln net.Listener, name string, handle func(net.Conn)) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			log.Printf("%s: accept: %v", name, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go handle(conn)
	}
}

// serveEcho sends back the first line of a connection and closes it.
func serveEcho(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	conn.Write([]byte(line))
}

// serveTCP answers "workload <hostname> <counter>" and closes. The
// hostname is read now, so a sibling answers with its own.
func (s *server) serveTCP(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	fmt.Fprintf(conn, "workload %s %d\n", host, s.counter.Load())
}

func (s *server) countForever() {
	t := time.NewTicker(counterPeriod)
	for range t.C {
		s.counter.Add(1)
	}
}

func (s *server) writeCounterFileForever(path string) {
	t := time.NewTicker(counterFilePeriod)
	var lastErr string
	for range t.C {
		err := writeFileAtomic(path, []byte(strconv.FormatInt(s.counter.Load(), 10)))
		// Log a failure once, not ten times a second.
		if msg := fmt.Sprint(err); err != nil && msg != lastErr {
			log.Printf("write counter file: %v", err)
			lastErr = msg
		} else if err == nil {
			lastErr = ""
		}
	}
}

// measureGapsForever records the longest time between two consecutive
// 1 ms ticks: while the process is frozen no tick is received, so the gap
// shows how long a fork stopped the source.
func (s *server) measureGapsForever() {
	t := time.NewTicker(gapPeriod)
	last := time.Now()
	for range t.C {
		now := time.Now() // the tick's own time is when it was sent, not received
		gap := int64(now.Sub(last))
		last = now
		for {
			cur := s.maxGapNs.Load()
			if gap <= cur || s.maxGapNs.CompareAndSwap(cur, gap) {
				break
			}
		}
	}
}

// serveControl handles the requests of one control connection in order.
func (s *server) serveControl(conn net.Conn) {
	defer conn.Close()
	sc := newLineScanner(conn)
	for sc.Scan() {
		msg, err := encodeMessage(s.handle(sc.Bytes()))
		if err != nil {
			log.Printf("control: encode response: %v", err)
			return
		}
		if _, err := conn.Write(msg); err != nil {
			return // the client went away
		}
	}
}

// handle runs one control request.
func (s *server) handle(line []byte) controlResponse {
	req, err := decodeRequest(line)
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		return controlResponse{Error: err.Error()}
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	switch req.Op {
	case opMutate:
		return s.mutate(req)
	case opEventfd:
		var opErr error
		if opErr = s.events.add(req.N); opErr != nil {
			opErr = fmt.Errorf("eventfd: %w", opErr)
		}
		return controlResponse{OK: true, Report: s.report(controlRequest{Op: opReport}, opErr)}
	default:
		return controlResponse{OK: true, Report: s.report(req, nil)}
	}
}

// mutate applies a mutation and reports the result, with the memory hash
// when the memory changed.
func (s *server) mutate(req controlRequest) controlResponse {
	if err := s.tag.set(req.Tag); err != nil {
		return controlResponse{Error: err.Error()}
	}
	if err := appendLine(filepath.Join(s.cfg.stateDir, mutationsLogName), req.Tag); err != nil {
		return controlResponse{Error: fmt.Sprintf("append to %s: %v", mutationsLogName, err)}
	}
	if req.Mem {
		s.mem.rewriteHead(req.Tag)
	}
	return controlResponse{OK: true, Report: s.report(controlRequest{Op: opReport, Hash: req.Mem}, nil)}
}

// report gathers everything serve observes. opErr is a failure of the
// operation that asked for the report; it makes epoll_ok false when the
// operation was an eventfd write.
func (s *server) report(req controlRequest, opErr error) *Report {
	r := newReport()
	// Read the gap first, before this report's own work can add to it.
	if req.ResetGap {
		r.MaxGapMs = float64(s.maxGapNs.Swap(0)) / 1e6
	} else {
		r.MaxGapMs = float64(s.maxGapNs.Load()) / 1e6
	}
	// First samples of what must keep moving; the second ones are taken at
	// least tickWindow later, at the end.
	windowStart := time.Now()
	ticks0 := s.timer.ticks.Load()
	threads0 := s.threads.snapshot()

	r.PID = os.Getpid()
	r.StateDir, r.UnixSocket, r.ControlSocket, r.TCPPort = s.cfg.stateDir, s.cfg.unixSocket, s.cfg.control, s.tcpPort
	var err error
	if r.Hostname, err = os.Hostname(); err != nil {
		r.addError("hostname: %v", err)
	}
	r.Mark = os.Getenv(markEnv)
	if r.Cwd, err = unix.Getwd(); err != nil {
		r.addError("getcwd: %v", err)
	}

	s.reportTree(r)
	s.reportFiles(r)

	r.Counter = s.counter.Load()
	if r.CounterFile, err = readCounterFile(filepath.Join(s.cfg.stateDir, counterFileName)); err != nil {
		r.addError("counter file: %v", err)
	}

	r.Tag = s.tag.get()
	if b, err := os.ReadFile(filepath.Join(s.cfg.stateDir, mutationsLogName)); err == nil {
		r.Mutations = bytes.Count(b, []byte("\n"))
	} else if !errors.Is(err, os.ErrNotExist) {
		r.addError("read %s: %v", mutationsLogName, err)
	}

	s.mem.mu.RLock()
	r.MemMiB, r.MemSeed, r.MemHeadTag = s.cfg.memMiB, s.mem.seed, s.mem.headTag
	s.mem.mu.RUnlock()
	if req.Hash {
		r.MemSHA256 = s.mem.sha256()
		if err := s.mem.verify(); err != nil {
			r.addError("memory: %v", err)
		} else {
			r.MemVerified = true
		}
	}

	r.EpollOK = true
	if opErr != nil {
		r.EpollOK = false
		r.addError("%v", opErr)
	}
	if err := s.events.ping(); err != nil {
		r.EpollOK = false
		r.addError("epoll: %v", err)
	}
	r.EventfdTotal = s.events.total.Load()
	r.EventfdWritten = s.events.written.Load()
	r.EpollWakeups = s.events.wakeups.Load()

	r.ThreadSigBlkTID = s.threads.tids[sigblkThread]
	if r.ThreadSigBlk, err = readSigBlk(r.ThreadSigBlkTID); err != nil {
		r.addError("signal mask of thread %d: %v", r.ThreadSigBlkTID, err)
	} else if blocked, err := maskHasSignal(r.ThreadSigBlk, unix.SIGUSR1); err != nil || !blocked {
		r.addError("thread %d does not block SIGUSR1 (SigBlk %s)", r.ThreadSigBlkTID, r.ThreadSigBlk)
	}

	if interval, err := s.timer.interval(); err != nil {
		r.addError("%v", err)
	} else {
		r.TimerfdIntervalNs = int64(interval)
		if interval != timerInterval {
			r.addError("timerfd interval is %v, want %v", interval, timerInterval)
		}
	}

	time.Sleep(tickWindow - time.Since(windowStart))
	r.TimerfdTicks = s.timer.ticks.Load()
	r.TimerfdTicking = r.TimerfdTicks > ticks0
	if !r.TimerfdTicking {
		msg := fmt.Sprintf("timerfd did not tick in %v", tickWindow)
		if f, ok := s.timer.failure.Load().(string); ok {
			msg += " (" + f + ")"
		}
		r.Errors = append(r.Errors, msg)
	}
	r.Threads = s.threads.snapshot()
	r.ThreadsTicking = true
	for i, t := range r.Threads {
		if t.Count <= threads0[i].Count {
			r.ThreadsTicking = false
			r.addError("counter thread %d (tid %d) did not tick in %v", i, t.TID, tickWindow)
		}
	}
	return r
}

// reportTree asks every child who it is and checks the pipe and socketpair
// round trips.
func (s *server) reportTree(r *Report) {
	r.Tree = []ProcInfo{selfInfo(roleServe), s.tree.a.info(), s.tree.a1.info(), s.tree.b.info()}
	r.Errors = append(r.Errors, checkTree(r.Tree)...)
	if err := s.tree.a.roundtrip(); err != nil {
		r.addError("pipe round trip with A: %v", err)
	} else {
		r.PipeRoundtrip = true
	}
	if err := s.tree.b.roundtrip(); err != nil {
		r.addError("socketpair round trip with B: %v", err)
	} else {
		r.SocketpairRoundtrip = true
	}
}

// reportFiles checks the offset file and the unlinked file.
func (s *server) reportFiles(r *Report) {
	var err error
	if r.FileOffset, err = s.files.offset.Seek(0, io.SeekCurrent); err != nil {
		r.addError("offset file: lseek: %v", err)
	} else if r.FileOffset != offsetFilePos {
		r.addError("offset file: offset is %d, want %d", r.FileOffset, offsetFilePos)
	}
	if st, err := s.files.offset.Stat(); err != nil {
		r.addError("offset file: fstat: %v", err)
	} else if r.FileSize = st.Size(); r.FileSize != offsetFileSize {
		r.addError("offset file: size is %d, want %d", r.FileSize, offsetFileSize)
	}

	if _, err := os.Lstat(s.files.deletedPath); err == nil {
		r.DeletedPathExists = true
		r.addError("%s exists again after being unlinked", s.files.deletedPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		r.addError("lstat %s: %v", s.files.deletedPath, err)
	}
	if content, err := readAllAt(s.files.deleted); err != nil {
		r.addError("read the unlinked file: %v", err)
	} else {
		r.DeletedSize = int64(len(content))
		r.DeletedSHA256 = sha256Hex(content)
		if r.DeletedSHA256 != s.files.deletedSum {
			r.addError("unlinked file content changed: sha256 %s, want %s", r.DeletedSHA256, s.files.deletedSum)
		}
	}
}
