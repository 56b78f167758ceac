package hostagent

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/procfs"
)

// reapExecConmon ends the conmon processes of a removed exec session.
//
// Podman's exec conmon waits five minutes (engine.exit_command_delay) after
// the command ended before it runs `podman container cleanup --exec`, in a
// child it forks for that; removing the session does not stop either. A
// fork whose readiness or hooks exec would leave a pair behind for each
// command. The session is gone, so its cleanup has nothing left to do: the
// pair is killed, child first (a parent killed first would leave the child
// to run the cleanup later). Only processes whose arguments name this
// session (-u SESSION) and an exec (--exec-attach) are touched.
func reapExecConmon(session string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		pids := execConmonPids(session)
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		// Children (parent among the pair) before parents.
		for _, child := range []bool{true, false} {
			for pid, ppid := range pids {
				_, parentMatches := pids[ppid]
				if parentMatches == child {
					killIfStill(pid, session)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// execConmonPids maps the live conmon processes of the exec session to
// their parents.
func execConmonPids(session string) map[int]int {
	out := map[int]int{}
	pids, err := procfs.Pids()
	if err != nil {
		return out
	}
	for _, pid := range pids {
		if !isExecConmon(pid, session) {
			continue
		}
		if ppid, ok := liveParent(pid); ok {
			out[pid] = ppid
		}
	}
	return out
}

func isExecConmon(pid int, session string) bool {
	args, err := procfs.Cmdline(pid)
	if err != nil || len(args) == 0 || filepath.Base(args[0]) != "conmon" {
		return false
	}
	var ours, exec bool
	for i, a := range args {
		ours = ours || (a == "-u" && i+1 < len(args) && args[i+1] == session)
		exec = exec || a == "--exec-attach"
	}
	return ours && exec
}

// liveParent returns the parent of a process that is not a zombie.
func liveParent(pid int) (int, bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil || st.Exited() {
		return 0, false
	}
	return st.PPid, true
}

// killIfStill kills pid through a pidfd, after checking again, through that
// pidfd's process, that it is the session's conmon: the PID cannot have
// been reused in between.
func killIfStill(pid int, session string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if isExecConmon(pid, session) {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}
