package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// GuardCommand is the hidden argv[1] under which the tclone binary runs as a
// thaw guard. The binary's main calls RunGuardIfAsked first thing.
const GuardCommand = "__tclone-thaw-guard"

// A Guard is a separate process that thaws a source's cgroup if tclone dies
// while a capture may have it frozen. CRIU freezes the cgroup, seizes the
// tree, thaws the cgroup and later re-freezes it briefly before it lets go;
// if tclone is killed, CRIU notices on its next message and unwinds, but if
// CRIU itself dies in the wrong instant the cgroup stays frozen. The guard
// waits for the CRIU processes it was told about to end, then thaws.
//
// Protocol on the guard's stdin: "watch PID" lines add CRIU processes to wait
// for; "done" ends the guard without touching anything. End of input without
// "done" means tclone died.
type Guard struct {
	cmd *exec.Cmd
	w   *os.File
}

// maxGuardWait bounds how long the guard waits for CRIU before thawing anyway.
const maxGuardWait = 10 * time.Minute

// StartGuard starts a guard for f.
func StartGuard(f *Freezer) (*Guard, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("starting thaw guard: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting thaw guard: %w", err)
	}
	defer r.Close()
	v2 := "0"
	if f.V2 {
		v2 = "1"
	}
	cmd := exec.Command(self, GuardCommand, f.Dir, v2)
	cmd.Stdin = r
	// Its own session: signals aimed at tclone's process group (a terminal's
	// ^C, a monitor killing the group) must not take the guard with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("starting thaw guard: %w", err)
	}
	return &Guard{cmd: cmd, w: w}, nil
}

// Watch tells the guard to wait for CRIU process pid before thawing.
func (g *Guard) Watch(pid int) {
	fmt.Fprintf(g.w, "watch %d\n", pid)
}

// Done releases the guard: the capture finished and the source is running.
func (g *Guard) Done() {
	fmt.Fprintln(g.w, "done")
	g.w.Close()
	g.cmd.Wait()
}

// RunGuardIfAsked runs the guard and exits when argv asks for it.
func RunGuardIfAsked() {
	if len(os.Args) < 4 || os.Args[1] != GuardCommand {
		return
	}
	f := &Freezer{Dir: os.Args[2], V2: os.Args[3] == "1"}
	os.Exit(runGuard(f, os.Stdin))
}

func runGuard(f *Freezer, in *os.File) int {
	var watched []int
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch verb {
		case "done":
			return 0
		case "watch":
			if pid, err := strconv.Atoi(arg); err == nil {
				watched = append(watched, pid)
			}
		}
	}
	// tclone is gone without saying done.
	deadline := time.Now().Add(maxGuardWait)
	for _, pid := range watched {
		waitExit(pid, deadline)
	}
	if _, err := f.ThawIfFrozen(); err != nil {
		fmt.Fprintf(os.Stderr, "tclone thaw guard: %v\n", err)
		return 1
	}
	return 0
}

// waitExit waits for pid to exit, or for the deadline.
func waitExit(pid int, deadline time.Time) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // already gone
	}
	defer unix.Close(fd)
	for time.Now().Before(deadline) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 1000)
		if err == nil && n > 0 {
			return
		}
	}
}
