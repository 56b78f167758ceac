package lazypages

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the guard process itself. It runs in a child made by clone(2)
// without exec, a copy of the daemon with only the calling thread, so the Go
// runtime cannot run in it: everything here is nosplit, allocates nothing,
// writes no pointers, and makes only raw system calls, as
// syscall.forkAndExecInChild does. All signals are blocked; only SIGKILL can
// end it early.

// guard record ops, written by the daemon to the guard's control pipe.
const (
	guardArmTask        = 1 // fd is a pidfd of a task of an incomplete sibling
	guardDisarmTask     = 2
	guardArmConn        = 3 // fd is a restore's connection: its unread senders are at risk
	guardDisarmConn     = 4
	guardArmListener    = 5 // fd is a listening socket: its unaccepted restores are at risk
	guardDisarmListener = 6
	guardExit           = 7 // the daemon is closing cleanly
	guardArmRestore     = 8 // fd is a pidfd of the CRIU restoring an incomplete sibling
	guardDisarmRestore  = 9
)

const (
	guardRecordSize = 8
	guardMaxFDs     = 4096
	// guardKillWait bounds how long the guard waits, in nanoseconds, for
	// the tasks it killed to be gone before it exits (and with it the last
	// reference to their userfaultfds).
	guardKillWait = 10e9
	// guardRestoreGrace is how long a CRIU restoring killed tasks gets to
	// end before it is killed too (killRestore).
	guardRestoreGrace = 2e9
)

type fdSet struct {
	n   int
	fds [guardMaxFDs]int32
}

//go:nosplit
//go:norace
func (s *fdSet) add(fd int32) {
	if s.n < len(s.fds) {
		s.fds[s.n] = fd
		s.n++
	}
}

//go:nosplit
//go:norace
func (s *fdSet) del(fd int32) {
	for i := 0; i < s.n && i < len(s.fds); i++ {
		if s.fds[i] == fd {
			s.n--
			s.fds[i] = s.fds[s.n]
			return
		}
	}
}

// guardState is all the guard's memory, allocated by the daemon before the
// clone.
type guardState struct {
	ctl   int32 // read end of the control pipe (non-blocking)
	owner int32 // pidfd of the daemon

	tasks, conns, listeners, restores fdSet

	rec          [64 * guardRecordSize]byte
	polls        [guardMaxFDs + 2]unix.PollFd
	alive        [guardMaxFDs]bool
	restoreAlive [guardMaxFDs]bool
	connOpen     [guardMaxFDs]bool

	msg  unix.Msghdr
	iov  unix.Iovec
	data [64]byte
	oob  [1024]byte

	name   [16]byte
	oomAdj [32]byte
	oomVal [8]byte
	ts     unix.Timespec
	start  unix.Timespec
	now    unix.Timespec
	one    int32
}

func newGuardState(ctl, owner int) *guardState {
	s := &guardState{ctl: int32(ctl), owner: int32(owner)}
	s.iov.Base = &s.data[0]
	s.iov.SetLen(len(s.data))
	s.msg.Iov = &s.iov
	s.msg.Iovlen = 1
	s.msg.Control = &s.oob[0]
	copy(s.name[:], "lazypages-guard")
	copy(s.oomAdj[:], "/proc/self/oom_score_adj")
	copy(s.oomVal[:], "-1000")
	s.one = 1
	return s
}

//go:nosplit
//go:norace
func guardMain(s *guardState) {
	// Out of the daemon's session and process group, so that a signal to
	// either does not reach the guard too; and never the OOM killer's pick.
	syscall.RawSyscall(syscall.SYS_SETSID, 0, 0, 0)
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&s.name[0])), 0)
	fd, _, e := syscall.RawSyscall(syscall.SYS_OPEN, uintptr(unsafe.Pointer(&s.oomAdj[0])), syscall.O_WRONLY, 0)
	if e == 0 {
		syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.oomVal[0])), 5)
		syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	}
	for {
		s.polls[0] = unix.PollFd{Fd: s.ctl, Events: unix.POLLIN}
		s.polls[1] = unix.PollFd{Fd: s.owner, Events: unix.POLLIN}
		syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&s.polls[0])), 2, 0, 0, 0, 0)
		if s.readRecords() {
			guardExitNow()
		}
		if s.polls[1].Revents != 0 {
			s.ownerDied()
			guardExitNow()
		}
	}
}

//go:nosplit
//go:norace
func guardExitNow() {
	for {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
}

// readRecords applies every record in the pipe; true when one asked the
// guard to exit.
//
//go:nosplit
//go:norace
func (s *guardState) readRecords() bool {
	exit := false
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(s.ctl), uintptr(unsafe.Pointer(&s.rec[0])), uintptr(len(s.rec)))
		if e != 0 || n == 0 {
			return exit
		}
		for off := uintptr(0); off+guardRecordSize <= n && off+guardRecordSize <= uintptr(len(s.rec)); off += guardRecordSize {
			op := *(*uint32)(unsafe.Pointer(&s.rec[off]))
			fd := *(*int32)(unsafe.Pointer(&s.rec[off+4]))
			exit = s.apply(op, fd) || exit
		}
	}
}

//go:nosplit
//go:norace
func (s *guardState) apply(op uint32, fd int32) bool {
	switch op {
	case guardArmTask:
		s.tasks.add(fd)
	case guardDisarmTask:
		s.tasks.del(fd)
	case guardArmConn:
		s.conns.add(fd)
	case guardDisarmConn:
		s.conns.del(fd)
	case guardArmListener:
		s.listeners.add(fd)
	case guardDisarmListener:
		s.listeners.del(fd)
	case guardArmRestore:
		s.restores.add(fd)
	case guardDisarmRestore:
		s.restores.del(fd)
	case guardExit:
		return true
	}
	return false
}

// ownerDied kills every task whose memory the dead daemon had not finished:
// the armed tasks, the senders of messages it never read, and the senders of
// restores it never accepted. Then it waits for them to be gone, and kills
// the CRIU restoring an incomplete sibling if they are not gone soon (see
// killRestore). Until the
// guard exits, their userfaultfds stay open in the shared descriptor table,
// so a task that faults meanwhile waits (killably) instead of reading zeros.
//
//go:nosplit
//go:norace
func (s *guardState) ownerDied() {
	s.readRecords()
	for i := 0; i < s.listeners.n && i < len(s.listeners.fds); i++ {
		s.drainListener(s.listeners.fds[i])
	}
	for i := 0; i < s.conns.n && i < len(s.conns.fds); i++ {
		s.connOpen[i] = !s.drainConn(s.conns.fds[i])
	}
	for i := 0; i < s.tasks.n && i < len(s.tasks.fds); i++ {
		syscall.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(s.tasks.fds[i]), uintptr(syscall.SIGKILL), 0, 0, 0, 0)
		s.alive[i] = true
	}
	for i := 0; i < s.restores.n && i < len(s.restores.fds); i++ {
		s.restoreAlive[i] = true
	}
	s.clock(&s.start)
	restoresKilled := false
	for s.waitRound() {
		s.clock(&s.now)
		elapsed := (s.now.Sec-s.start.Sec)*1e9 + (s.now.Nsec - s.start.Nsec)
		if !restoresKilled && elapsed >= guardRestoreGrace {
			restoresKilled = true
			for i := 0; i < s.restores.n && i < len(s.restores.fds); i++ {
				if s.restoreAlive[i] {
					syscall.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(s.restores.fds[i]), uintptr(syscall.SIGKILL), 0, 0, 0, 0)
				}
			}
		}
		if elapsed >= guardKillWait {
			return
		}
	}
}

//go:nosplit
//go:norace
func (s *guardState) clock(ts *unix.Timespec) {
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(ts)), 0)
}

// waitRound waits up to 100 ms for killed tasks and the CRIUs restoring
// them to exit, and for restores to send or close; false once nothing is
// left to wait for.
//
//go:nosplit
//go:norace
func (s *guardState) waitRound() bool {
	n := 0
	for i := 0; i < s.tasks.n && i < len(s.tasks.fds) && n < len(s.polls); i++ {
		if s.alive[i] {
			s.polls[n] = unix.PollFd{Fd: s.tasks.fds[i], Events: unix.POLLIN}
			n++
		}
	}
	for i := 0; i < s.restores.n && i < len(s.restores.fds) && n < len(s.polls); i++ {
		if s.restoreAlive[i] {
			s.polls[n] = unix.PollFd{Fd: s.restores.fds[i], Events: unix.POLLIN}
			n++
		}
	}
	for i := 0; i < s.conns.n && i < len(s.conns.fds) && n < len(s.polls); i++ {
		if s.connOpen[i] {
			s.polls[n] = unix.PollFd{Fd: s.conns.fds[i], Events: unix.POLLIN | unix.POLLRDHUP}
			n++
		}
	}
	if n == 0 {
		return false
	}
	// ppoll writes back the time left: set the timeout every round.
	s.ts.Sec, s.ts.Nsec = 0, 100e6
	syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&s.polls[0])), uintptr(n), uintptr(unsafe.Pointer(&s.ts)), 0, 0, 0)
	n = 0
	for i := 0; i < s.tasks.n && i < len(s.tasks.fds) && n < len(s.polls); i++ {
		if s.alive[i] {
			if s.polls[n].Revents != 0 {
				s.alive[i] = false
			}
			n++
		}
	}
	for i := 0; i < s.restores.n && i < len(s.restores.fds) && n < len(s.polls); i++ {
		if s.restoreAlive[i] {
			if s.polls[n].Revents != 0 {
				s.restoreAlive[i] = false
			}
			n++
		}
	}
	// Connections last: reading one may add tasks, which the next round
	// polls.
	conns := s.conns.n
	for i := 0; i < conns && i < len(s.conns.fds) && n < len(s.polls); i++ {
		if s.connOpen[i] {
			if s.polls[n].Revents != 0 && s.drainConn(s.conns.fds[i]) {
				s.connOpen[i] = false
			}
			n++
		}
	}
	return true
}

// drainListener stops new restores from connecting and drains those that
// connected but were never accepted.
//
//go:nosplit
//go:norace
func (s *guardState) drainListener(fd int32) {
	syscall.RawSyscall(syscall.SYS_SHUTDOWN, uintptr(fd), syscall.SHUT_RD, 0)
	for k := 0; k < guardMaxFDs; k++ {
		c, _, e := syscall.RawSyscall6(syscall.SYS_ACCEPT4, uintptr(fd), 0, 0, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0, 0)
		if e != 0 {
			return
		}
		syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, c, syscall.SOL_SOCKET, syscall.SO_PASSCRED, uintptr(unsafe.Pointer(&s.one)), 4, 0)
		s.conns.add(int32(c))
	}
}

// drainConn reads what a restore sent and the daemon did not read, and
// kills every sender (SCM_CREDENTIALS). The userfaultfds that come with the
// messages land in the shared table, which keeps them registered until the
// guard exits. It reports whether the restore closed the connection: until
// then its tasks may still send (a userfaultfd left in flight when the
// guard exits would be dropped with the socket, and its task would read
// zeros), so the guard goes on reading it.
//
//go:nosplit
//go:norace
func (s *guardState) drainConn(fd int32) bool {
	for k := 0; k < guardMaxFDs; k++ {
		s.msg.Controllen = uint64(len(s.oob))
		n, _, e := syscall.RawSyscall(syscall.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&s.msg)), syscall.MSG_DONTWAIT)
		if e == syscall.EAGAIN || e == syscall.EINTR {
			return false
		}
		if e != 0 || n == 0 {
			return true
		}
		s.killSenders(uintptr(s.msg.Controllen))
	}
	return false
}

//go:nosplit
//go:norace
func (s *guardState) killSenders(controlLen uintptr) {
	const hdr = unix.SizeofCmsghdr
	for off := uintptr(0); off+hdr+unix.SizeofUcred <= controlLen && off+hdr+unix.SizeofUcred <= uintptr(len(s.oob)); {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&s.oob[off]))
		if h.Len < hdr {
			return
		}
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_CREDENTIALS {
			pid := *(*int32)(unsafe.Pointer(&s.oob[off+hdr]))
			pidfd, _, e := syscall.RawSyscall(unix.SYS_PIDFD_OPEN, uintptr(pid), 0, 0)
			if e == 0 && pid > 0 && s.tasks.n < len(s.tasks.fds) {
				s.tasks.add(int32(pidfd))
				s.alive[s.tasks.n-1] = true
				syscall.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, pidfd, uintptr(syscall.SIGKILL), 0, 0, 0, 0)
			}
		}
		off += (uintptr(h.Len) + 7) &^ 7
	}
}
