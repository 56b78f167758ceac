package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The process tree serve builds:
//
//	serve ── A  (same session, own process group; talks over two pipes)
//	│        └── A1 (A's child, in A's group; talks over a socketpair)
//	└──── B  (own session via setsid; talks over a socketpair)
//
// Children are serve's own binary re-executed through /proc/self/exe with
// a hidden subcommand. They only answer serve's questions and exit when
// their channel to serve reaches EOF, so killing serve by pid is enough to
// clean up the whole tree.
//
// Children are started with syscall.ForkExec rather than os/exec: since Go
// 1.23 os.StartProcess keeps a pidfd for every child, and a pidfd is one
// more (recent) file kind CRIU would have to dump, which is not what these
// tests are about.

// childSubcommand is the hidden subcommand a child runs.
const childSubcommand = "__child"

// Roles in the process tree.
const (
	roleServe = "serve"
	roleA     = "A"
	roleA1    = "A1"
	roleB     = "B"
)

// Fds of a child's channel to serve, as laid out by ForkExec's Files.
const (
	childFDIn    = 3 // requests from serve (A: read end of a pipe; A1, B: a socket)
	childFDOut   = 4 // answers to serve (A only: write end of a pipe)
	childFDForA1 = 5 // A only: the socket A hands on to A1
)

// markEnv is the environment variable serve sets and children inherit.
const markEnv = "WORKLOAD_MARK"

// childTimeout bounds one question to a child.
const childTimeout = 2 * time.Second

// ProcInfo is one process of the tree as the process itself sees it.
type ProcInfo struct {
	Role  string `json:"role"`
	PID   int    `json:"pid"`
	PPID  int    `json:"ppid"`
	PGID  int    `json:"pgid"`
	SID   int    `json:"sid"`
	Mark  string `json:"mark"`
	Cwd   string `json:"cwd"`
	Error string `json:"error,omitempty"` // why the process could not be asked
}

// selfInfo describes the calling process. unix.Getwd is used rather than
// os.Getwd, which may answer from $PWD.
func selfInfo(role string) ProcInfo {
	info := ProcInfo{
		Role: role,
		PID:  unix.Getpid(),
		PPID: unix.Getppid(),
		Mark: os.Getenv(markEnv),
	}
	var errs []string
	var err error
	if info.PGID, err = unix.Getpgid(0); err != nil {
		errs = append(errs, fmt.Sprintf("getpgid: %v", err))
	}
	if info.SID, err = unix.Getsid(0); err != nil {
		errs = append(errs, fmt.Sprintf("getsid: %v", err))
	}
	if info.Cwd, err = unix.Getwd(); err != nil {
		errs = append(errs, fmt.Sprintf("getcwd: %v", err))
	}
	info.Error = strings.Join(errs, "; ")
	return info
}

// The child protocol is one line per message. serve sends "<id> <verb>" or
// "<id> <verb> <arg>"; the child answers "<id> <payload>". Ids let serve
// drop a late answer to a question that already timed out. Verbs:
//
//	info         payload: the child's ProcInfo as JSON
//	echo TOKEN   payload: TOKEN
const (
	verbInfo = "info"
	verbEcho = "echo"
)

func encodeChildLine(id uint64, text string) string {
	return strconv.FormatUint(id, 10) + " " + text + "\n"
}

// parseChildLine splits a protocol line (without its newline) into its id
// and the rest.
func parseChildLine(line string) (uint64, string, error) {
	idText, rest, ok := strings.Cut(line, " ")
	if !ok {
		return 0, "", fmt.Errorf("malformed child protocol line %q: no space after the id", line)
	}
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("malformed child protocol line %q: bad id: %w", line, err)
	}
	return id, rest, nil
}

// answerChild computes a child's answer to one request line.
func answerChild(role, line string) (string, error) {
	id, req, err := parseChildLine(line)
	if err != nil {
		return "", err
	}
	verb, arg, _ := strings.Cut(req, " ")
	switch verb {
	case verbInfo:
		b, err := json.Marshal(selfInfo(role))
		if err != nil {
			return "", fmt.Errorf("encode info: %w", err)
		}
		return encodeChildLine(id, string(b)), nil
	case verbEcho:
		return encodeChildLine(id, arg), nil
	default:
		return "", fmt.Errorf("unknown verb %q from serve", verb)
	}
}

// childMain is the hidden subcommand. args is the role.
func childMain(args []string) error {
	if len(args) != 1 {
		return usagef("%s takes exactly one role", childSubcommand)
	}
	role := args[0]
	log.SetFlags(0)
	log.SetPrefix(fmt.Sprintf("workload %s[%d]: ", role, os.Getpid()))
	// The fds serve passed are not close-on-exec here (ForkExec clears the
	// flag when it moves them into place); set it again so that A1 inherits
	// only what A passes on explicitly.
	for _, fd := range []int{childFDIn, childFDOut, childFDForA1} {
		syscall.CloseOnExec(fd) // harmless on fds that are not open
	}
	var in io.Reader
	var out io.Writer
	switch role {
	case roleA:
		in = os.NewFile(childFDIn, "pipe-from-serve")
		out = os.NewFile(childFDOut, "pipe-to-serve")
		a1 := os.NewFile(childFDForA1, "socket-for-A1")
		pid, err := spawnChild(roleA1, []uintptr{childFDForA1}, nil)
		if err != nil {
			return err
		}
		a1.Close() // A1 owns it now; keeping it would keep A1's EOF from coming.
		go reapOne(pid, roleA1)
	case roleA1, roleB:
		conn := os.NewFile(childFDIn, "socket-to-serve")
		in, out = conn, conn
	default:
		return usagef("unknown role %q", role)
	}
	return answerLoop(role, in, out)
}

// answerLoop answers serve's requests until EOF, which means serve is gone.
func answerLoop(role string, in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		answer, err := answerChild(role, sc.Text())
		if err != nil {
			return err
		}
		if _, err := io.WriteString(out, answer); err != nil {
			return fmt.Errorf("answer serve: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read from serve: %w", err)
	}
	return nil
}

// reapOne waits for one child and logs how it ended.
func reapOne(pid int, role string) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			log.Printf("wait for %s (pid %d): %v", role, pid, err)
			return
		}
		log.Printf("%s (pid %d) %s", role, pid, describeWait(ws))
		return
	}
}

func describeWait(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("was killed by %v", ws.Signal())
	default:
		return fmt.Sprintf("changed state (wait status 0x%x)", uint32(ws))
	}
}

// spawnChild re-executes this binary as a child with the given role. extra
// are the caller's fds that become the child's fds 3, 4, ...; stdin is
// /dev/null, stdout and stderr are the caller's stderr (children only log).
func spawnChild(role string, extra []uintptr, sys *syscall.SysProcAttr) (int, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, fmt.Errorf("spawn %s: %w", role, err)
	}
	defer devnull.Close()
	files := append([]uintptr{devnull.Fd(), 2, 2}, extra...)
	// /proc/self/exe rather than os.Args[0]: it needs no PATH and works
	// wherever the binary was mounted in the container.
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"workload", childSubcommand, role}, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: files,
		Sys:   sys,
	})
	if err != nil {
		return 0, fmt.Errorf("spawn %s: %w", role, err)
	}
	return pid, nil
}

// childLink is serve's end of the channel to one child.
type childLink struct {
	role    string
	pid     int // 0 for A1, which is not serve's child; the reaper never sees it
	w       *os.File
	timeout time.Duration // bound on one question

	lines   chan string  // lines the child sent; closed at EOF
	readErr atomic.Value // error: why lines was closed
	exited  atomic.Value // string: how the child ended, set by serve's reaper

	mu     sync.Mutex // one question at a time
	nextID uint64
}

// newChildLink starts reading r. r and w must be pollable (non-blocking)
// files so that write deadlines work.
func newChildLink(role string, pid int, r, w *os.File) *childLink {
	l := &childLink{role: role, pid: pid, w: w, timeout: childTimeout, lines: make(chan string, 16)}
	go l.readLoop(r)
	return l
}

func (l *childLink) readLoop(r *os.File) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		l.lines <- sc.Text()
	}
	err := sc.Err()
	if err == nil {
		err = io.EOF
	}
	l.readErr.Store(err)
	close(l.lines)
}

// call sends one request and waits for its answer.
func (l *childLink) call(verb, arg string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if how, ok := l.exited.Load().(string); ok {
		return "", fmt.Errorf("child %s (pid %d) %s", l.role, l.pid, how)
	}
	l.nextID++
	id := l.nextID
	text := verb
	if arg != "" {
		text += " " + arg
	}
	deadline := time.Now().Add(l.timeout)
	if err := l.w.SetWriteDeadline(deadline); err != nil {
		return "", fmt.Errorf("child %s: set write deadline: %w", l.role, err)
	}
	if _, err := io.WriteString(l.w, encodeChildLine(id, text)); err != nil {
		return "", fmt.Errorf("child %s: send %s: %w", l.role, verb, err)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				return "", fmt.Errorf("child %s: channel closed: %v", l.role, l.readErr.Load())
			}
			got, payload, err := parseChildLine(line)
			if err != nil {
				return "", fmt.Errorf("child %s: %w", l.role, err)
			}
			if got < id {
				continue // late answer to a question that timed out
			}
			if got != id {
				return "", fmt.Errorf("child %s answered request %d, want %d", l.role, got, id)
			}
			return payload, nil
		case <-timer.C:
			return "", fmt.Errorf("child %s did not answer %s within %v", l.role, verb, l.timeout)
		}
	}
}

// info asks the child to describe itself.
func (l *childLink) info() ProcInfo {
	payload, err := l.call(verbInfo, "")
	if err != nil {
		return ProcInfo{Role: l.role, Error: err.Error()}
	}
	var info ProcInfo
	if err := json.Unmarshal([]byte(payload), &info); err != nil {
		return ProcInfo{Role: l.role, Error: fmt.Sprintf("child %s sent bad info %q: %v", l.role, payload, err)}
	}
	return info
}

// roundtrip sends a fresh random token and checks it comes back unchanged.
func (l *childLink) roundtrip() error {
	token := randomHex(16)
	got, err := l.call(verbEcho, token)
	if err != nil {
		return err
	}
	if got != token {
		return fmt.Errorf("child %s echoed %q, want %q", l.role, got, token)
	}
	return nil
}

// processTree is serve's view of its children.
type processTree struct {
	a, a1, b *childLink
}

// startProcessTree starts A (which starts A1) and B and waits until all
// three answer, so that serve is only declared ready with a complete tree.
func startProcessTree() (*processTree, error) {
	a, a1, err := startA()
	if err != nil {
		return nil, err
	}
	b, err := startB()
	if err != nil {
		return nil, err
	}
	t := &processTree{a: a, a1: a1, b: b}
	// A freshly exec'd child may take a while to start on a slow machine;
	// give it several question timeouts before giving up.
	for _, l := range []*childLink{a, a1, b} {
		var info ProcInfo
		for range 5 {
			if info = l.info(); info.Error == "" {
				break
			}
		}
		if info.Error != "" {
			return nil, fmt.Errorf("child %s did not come up: %s", l.role, info.Error)
		}
	}
	return t, nil
}

// startA starts child A with two pipes (serve→A, A→serve) and hands it one
// end of a socketpair for its own child A1.
func startA() (a, a1 *childLink, err error) {
	var toA, fromA [2]int
	if err := unix.Pipe2(toA[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe to A: %w", err)
	}
	if err := unix.Pipe2(fromA[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe from A: %w", err)
	}
	a1Serve, a1Child, err := socketpair()
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair for A1: %w", err)
	}
	// A gets its own process group (setpgid(0, 0)) but stays in serve's
	// session.
	pid, err := spawnChild(roleA, []uintptr{uintptr(toA[0]), uintptr(fromA[1]), uintptr(a1Child)},
		&syscall.SysProcAttr{Setpgid: true})
	for _, fd := range []int{toA[0], fromA[1], a1Child} {
		unix.Close(fd) // the child's ends: only the child may keep them open
	}
	if err != nil {
		return nil, nil, err
	}
	w, err := pollableFile(toA[1], "pipe-to-A")
	if err != nil {
		return nil, nil, err
	}
	r, err := pollableFile(fromA[0], "pipe-from-A")
	if err != nil {
		return nil, nil, err
	}
	s, err := pollableFile(a1Serve, "socket-to-A1")
	if err != nil {
		return nil, nil, err
	}
	return newChildLink(roleA, pid, r, w), newChildLink(roleA1, 0, s, s), nil
}

// startB starts child B, which calls setsid, with a socketpair.
func startB() (*childLink, error) {
	serveEnd, childEnd, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair for B: %w", err)
	}
	pid, err := spawnChild(roleB, []uintptr{uintptr(childEnd)}, &syscall.SysProcAttr{Setsid: true})
	unix.Close(childEnd)
	if err != nil {
		return nil, err
	}
	s, err := pollableFile(serveEnd, "socket-to-B")
	if err != nil {
		return nil, err
	}
	return newChildLink(roleB, pid, s, s), nil
}

// socketpair returns a connected pair of close-on-exec unix stream sockets.
func socketpair() (int, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	return fds[0], fds[1], nil
}

// pollableFile wraps fd in an *os.File registered with Go's poller, which
// os.NewFile does for non-blocking fds, so that deadlines work on it.
func pollableFile(fd int, name string) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("%s: set non-blocking: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// markExited records that serve's reaper collected pid.
func (t *processTree) markExited(pid int, how string) bool {
	for _, l := range []*childLink{t.a, t.b} {
		if l.pid == pid {
			l.exited.Store(how)
			return true
		}
	}
	return false
}

// reapChildren collects every child that has ended without blocking. serve
// is often the container's PID 1, so it also inherits orphans (A1, if A
// dies) and must reap them too.
func (t *processTree) reapChildren() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			if err != nil && !errors.Is(err, syscall.ECHILD) {
				log.Printf("reap children: %v", err)
			}
			return
		}
		how := describeWait(ws)
		if t.markExited(pid, how) {
			log.Printf("child pid %d %s", pid, how)
		} else {
			log.Printf("reaped orphan pid %d, which %s", pid, how)
		}
	}
}
