package main

import (
	"fmt"
	"strings"
)

// Report is what probe, mutate and eventfd print. serve fills in what it
// observes itself; the client adds what only another process can observe
// (marked "client" below). Every field is always present in the JSON.
type Report struct {
	Hostname    string  `json:"hostname"`
	Mark        string  `json:"mark"`
	Cwd         string  `json:"cwd"`
	Counter     int64   `json:"counter"`
	CounterFile int64   `json:"counter_file"`
	MaxGapMs    float64 `json:"max_gap_ms"`

	Tree         []ProcInfo   `json:"tree"` // serve, A, A1, B in this order
	Threads      []ThreadInfo `json:"threads"`
	ThreadSigBlk string       `json:"thread_sigblk"`

	FileOffset        int64  `json:"file_offset"`
	FileSize          int64  `json:"file_size"`
	DeletedPathExists bool   `json:"deleted_path_exists"`
	DeletedSHA256     string `json:"deleted_sha256"`

	PipeRoundtrip       bool `json:"pipe_roundtrip"`
	SocketpairRoundtrip bool `json:"socketpair_roundtrip"`
	UnixListenRoundtrip bool `json:"unix_listen_roundtrip"` // client

	TimerfdTicks      uint64 `json:"timerfd_ticks"`
	TimerfdTicking    bool   `json:"timerfd_ticking"`
	TimerfdIntervalNs int64  `json:"timerfd_interval_ns"`

	MemMiB    int    `json:"mem_mib"`
	MemSeed   uint64 `json:"mem_seed"`
	MemSHA256 string `json:"mem_sha256"` // "" unless hashing was asked for

	Tag string `json:"tag"`

	FlockHeld     bool `json:"flock_held"`      // client
	PosixLockHeld bool `json:"posix_lock_held"` // client
	PosixLockPID  int  `json:"posix_lock_pid"`  // client

	EventfdTotal uint64 `json:"eventfd_total"`
	EpollOK      bool   `json:"epoll_ok"`

	TCPReply string `json:"tcp_reply"` // client

	Errors []string `json:"errors"`

	// Extras, beyond the fields the harness requires.
	PID             int    `json:"pid"` // serve's pid
	StateDir        string `json:"state_dir"`
	UnixSocket      string `json:"unix_socket"`
	ControlSocket   string `json:"control_socket"`
	TCPPort         int    `json:"tcp_port"`
	ThreadSigBlkTID int    `json:"thread_sigblk_tid"`
	ThreadsTicking  bool   `json:"threads_ticking"`
	DeletedSize     int64  `json:"deleted_size"`
	MemVerified     bool   `json:"mem_verified"` // hashed and found equal to what serve wrote
	MemHeadTag      string `json:"mem_head_tag"` // tag of the last mutate --mem, "" if none
	EventfdWritten  uint64 `json:"eventfd_written"`
	EpollWakeups    uint64 `json:"epoll_wakeups"`
	Mutations       int    `json:"mutations"` // lines in mutations.log
}

// newReport returns a report whose slices encode as [] rather than null.
func newReport() *Report {
	return &Report{Tree: []ProcInfo{}, Threads: []ThreadInfo{}, Errors: []string{}}
}

func (r *Report) addError(format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}

// checkTree returns the ways tree, as reported (serve, A, A1, B), differs
// from the shape serve built: A in serve's session with its own group, A1
// in A's group, B in its own session, all sharing serve's mark and cwd.
func checkTree(tree []ProcInfo) []string {
	byRole := map[string]ProcInfo{}
	var problems []string
	for _, p := range tree {
		if p.Error != "" {
			problems = append(problems, fmt.Sprintf("process %s: %s", p.Role, p.Error))
			continue
		}
		byRole[p.Role] = p
	}
	serve, okServe := byRole[roleServe]
	a, okA := byRole[roleA]
	a1, okA1 := byRole[roleA1]
	b, okB := byRole[roleB]
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	if okServe && okA {
		check(a.PPID == serve.PID, "A's parent is %d, want serve (%d)", a.PPID, serve.PID)
		check(a.PGID == a.PID, "A's process group is %d, want its own (%d)", a.PGID, a.PID)
		check(a.SID == serve.SID, "A's session is %d, want serve's (%d)", a.SID, serve.SID)
	}
	if okA && okA1 {
		check(a1.PPID == a.PID, "A1's parent is %d, want A (%d)", a1.PPID, a.PID)
		check(a1.PGID == a.PGID, "A1's process group is %d, want A's (%d)", a1.PGID, a.PGID)
		check(a1.SID == a.SID, "A1's session is %d, want A's (%d)", a1.SID, a.SID)
	}
	if okServe && okB {
		check(b.PPID == serve.PID, "B's parent is %d, want serve (%d)", b.PPID, serve.PID)
		check(b.SID == b.PID, "B's session is %d, want its own (%d)", b.SID, b.PID)
		check(b.PGID == b.PID, "B's process group is %d, want its own (%d)", b.PGID, b.PID)
	}
	if okServe {
		for _, p := range []ProcInfo{a, a1, b} {
			if p.Role == "" {
				continue // missing; reported above
			}
			check(p.Mark == serve.Mark, "%s's %s is %q, want serve's %q", p.Role, markEnv, p.Mark, serve.Mark)
			check(p.Cwd == serve.Cwd, "%s's cwd is %q, want serve's %q", p.Role, p.Cwd, serve.Cwd)
		}
	}
	return problems
}

// checkTCPReply returns why reply is not what serve's TCP listener should
// answer, or "" if it is.
func checkTCPReply(reply, hostname string) string {
	rest, ok := strings.CutPrefix(reply, "workload "+hostname+" ")
	if !ok {
		return fmt.Sprintf("TCP reply %q does not start with %q", reply, "workload "+hostname+" ")
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return fmt.Sprintf("TCP reply %q does not end with a counter", reply)
		}
	}
	if rest == "" {
		return fmt.Sprintf("TCP reply %q does not end with a counter", reply)
	}
	return ""
}
