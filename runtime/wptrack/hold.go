package wptrack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/fds"
	"github.com/tclone/tclone/runtime/internal/flock"
	"github.com/tclone/tclone/runtime/procfs"
)

// Between two branches of a source, its processes' userfaultfds must stay
// open: closing the last copy ends the tracking. A holder process, outside
// the source's container, keeps them, and ends when the source's init
// does; a state file says which descriptor of the holder's is which
// process's, and what the tracking's baseline is.
//
// The baseline is the instant of the last scan: a page the next scan does
// not report equals that capture's. It is only worth something once that
// capture's branch is durable (Commit); a capture that scans makes the
// state pending first, so that one that dies or fails afterwards leaves
// no baseline the next branch would trust.

// HoldCommand is the hidden argv[1] under which tclone runs as a holder.
const HoldCommand = "__tclone-track-hold"

// State is what a source's tracking holds, in <dir>/<source>.json.
type State struct {
	// Gen is the capture (its plan ID) that scanned last.
	Gen string `json:"gen"`
	// Base is the branch that capture became, once durable: the pages a
	// scan does not report are that branch's. Empty while pending.
	Base   string `json:"base,omitempty"`
	Holder Proc   `json:"holder"`
	// Tasks are the tracked processes, with their descriptors in the
	// holder.
	Tasks []Task `json:"tasks"`
}

// Proc names a process across pid reuse.
type Proc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Task is a tracked process and its userfaultfd in the holder.
type Task struct {
	Proc
	Fd int `json:"fd"`
}

func procOf(pid int) (Proc, error) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return Proc{}, err
	}
	if st.Exited() {
		return Proc{}, fmt.Errorf("process %d has exited", pid)
	}
	return Proc{Pid: pid, Start: st.StartTime}, nil
}

// alive says whether p is still the process it named.
func (p Proc) alive() bool {
	now, err := procOf(p.Pid)
	return err == nil && now.Start == p.Start
}

// Session is a source's tracking, locked for one capture.
type Session struct {
	dir, source string
	unlock      func()
	state       *State
}

func (s *Session) path() string { return filepath.Join(s.dir, s.source+".json") }

// Open locks the tracking of source (a container ID) in dir and reads it.
// A state whose holder is gone tracks nothing.
func Open(ctx context.Context, dir, source string) (*Session, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	unlock, err := flock.Lock(ctx, filepath.Join(dir, source+".lock"))
	if err != nil {
		return nil, err
	}
	s := &Session{dir: dir, source: source, unlock: unlock}
	b, err := os.ReadFile(s.path())
	if err == nil {
		var st State
		if json.Unmarshal(b, &st) == nil && st.Holder.alive() {
			s.state = &st
		}
	}
	return s, nil
}

// Close unlocks the session.
func (s *Session) Close() { s.unlock() }

// Take takes the trackers of the processes still tracked, by their pid,
// and the branch their unreported pages equal ("" for none: every page
// counts as written). It marks the tracking pending first: from here on, a
// capture that does not Hold leaves no baseline.
func (s *Session) Take(gen string) (map[int]*Tracker, string, error) {
	if s.state == nil {
		return map[int]*Tracker{}, "", nil
	}
	base := s.state.Base
	pending := *s.state
	pending.Gen, pending.Base = gen, ""
	if err := s.save(&pending); err != nil {
		return nil, "", err
	}
	pidfd, err := unix.PidfdOpen(s.state.Holder.Pid, 0)
	if err != nil {
		return nil, "", fmt.Errorf("write tracking: the holder: %w", err)
	}
	defer unix.Close(pidfd)
	if !s.state.Holder.alive() {
		return map[int]*Tracker{}, "", nil
	}
	out := map[int]*Tracker{}
	for _, t := range s.state.Tasks {
		if !t.alive() {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, t.Fd, 0)
		if err != nil {
			closeAll(out)
			return nil, "", fmt.Errorf("write tracking: taking the userfaultfd of process %d from the holder: %w", t.Pid, err)
		}
		tr, err := adopt(t.Pid, os.NewFile(uintptr(fd), fmt.Sprintf("userfaultfd of %d", t.Pid)))
		if err != nil {
			closeAll(out)
			return nil, "", err
		}
		out[t.Pid] = tr
	}
	return out, base, nil
}

func closeAll(m map[int]*Tracker) {
	for _, t := range m {
		t.Close()
	}
}

// Hold has a new holder keep trackers (by process pid) for source, whose
// init is process init, as capture gen's tracking, pending until Commit;
// the old holder ends. The trackers stay the caller's to close.
func (s *Session) Hold(gen string, init int, trackers map[int]*Tracker) error {
	initProc, err := procOf(init)
	if err != nil {
		return err
	}
	var files []*os.File
	var tasks []Task
	for pid, t := range trackers {
		p, err := procOf(pid)
		if err != nil {
			continue
		}
		tasks = append(tasks, Task{Proc: p, Fd: 3 + len(files)})
		files = append(files, t.uffd)
	}
	holder, err := spawnHolder(holdConfig{Init: initProc, Files: len(files), Dir: s.dir, Source: s.source}, files)
	if err != nil {
		return err
	}
	old := s.state
	st := &State{Gen: gen, Holder: holder, Tasks: tasks}
	if err := s.save(st); err != nil {
		endProc(holder)
		return err
	}
	s.state = st
	if old != nil && old.Holder != holder {
		endProc(old.Holder)
	}
	return nil
}

func (s *Session) save(st *State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path(), b, 0o600)
}

// Commit makes branch the baseline of source's tracking, if capture gen
// is still the last to have scanned it.
func Commit(ctx context.Context, dir, source, gen, branch string) error {
	s, err := Open(ctx, dir, source)
	if err != nil {
		return err
	}
	defer s.Close()
	if s.state == nil || s.state.Gen != gen {
		return nil
	}
	s.state.Base = branch
	return s.save(s.state)
}

// endProc kills p, if it is still the process it names, and waits (a
// second at most) until it has exited.
func endProc(p Proc) {
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !p.alive() || unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) != nil {
		return
	}
	procfs.PidfdExited(fd, time.Second)
}

type holdConfig struct {
	Init  Proc `json:"init"`
	Files int  `json:"files"`
	// Dir and Source name the state the holder removes when Init ends.
	Dir    string `json:"dir"`
	Source string `json:"source"`
}

func spawnHolder(cfg holdConfig, files []*os.File) (Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return Proc{}, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return Proc{}, err
	}
	cmd := exec.Command(self, HoldCommand, string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("write tracking: starting its holder: %w", err)
	}
	if err := cgroups.Escape(cmd.Process.Pid); err != nil {
		logrus.Warnf("write tracking: its holder stays in its caller's cgroup: %v", err)
	}
	// Reaped by whoever outlives it: the caller (a capture) ends first.
	go cmd.Wait()
	for i := 0; ; i++ {
		if p, err := procOf(cmd.Process.Pid); err == nil {
			return p, nil
		} else if i == 100 {
			cmd.Process.Kill()
			return Proc{}, err
		}
		time.Sleep(time.Millisecond)
	}
}

// RunHolderIfAsked runs a holder and exits when argv asks for it: it keeps
// its descriptors until the source's init ends.
func RunHolderIfAsked() {
	var cfg holdConfig
	if !fds.HelperArgsKeeping(HoldCommand, &cfg, func() int { return 2 + cfg.Files }) {
		return
	}
	fd, err := unix.PidfdOpen(cfg.Init.Pid, 0)
	if err == nil && cfg.Init.alive() {
		procfs.PidfdExited(fd, -1)
	}
	cfg.forget()
	os.Exit(0)
}

// forget removes the source's tracking once its init has ended, if it is
// still this holder's: a removed container leaves no state behind (tclone
// gc removes what a killed holder left). A capture of the source holding
// the lock is waited for, ten seconds at most.
func (cfg holdConfig) forget() {
	if cfg.Dir == "" || cfg.Source == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg.Dir, cfg.Source)
	if err != nil {
		return
	}
	defer s.Close()
	self, err := procOf(os.Getpid())
	if err != nil || s.state == nil || s.state.Holder != self {
		return
	}
	os.Remove(s.path())
	os.Remove(filepath.Join(cfg.Dir, cfg.Source+".lock"))
}

// Owns says whether every userfaultfd registration in process pid's
// memory is the tracking's of source (whose state is in dir): a twin
// capture refuses memory registered with someone else's userfaultfd,
// whose reader might be told of the twin, and the tracking's asks for no
// events. It tries to register each registered area with the tracking's
// own userfaultfd, which succeeds only for areas it registered itself.
func Owns(ctx context.Context, dir, source string, pid int) (bool, error) {
	s, err := Open(ctx, dir, source)
	if err != nil {
		return false, err
	}
	defer s.Close()
	if s.state == nil {
		return false, nil
	}
	var task *Task
	for i, t := range s.state.Tasks {
		if t.Pid == pid && t.alive() {
			task = &s.state.Tasks[i]
		}
	}
	if task == nil {
		return false, nil
	}
	pidfd, err := unix.PidfdOpen(s.state.Holder.Pid, 0)
	if err != nil {
		return false, nil
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, task.Fd, 0)
	if err != nil || !s.state.Holder.alive() {
		return false, nil
	}
	uffd := os.NewFile(uintptr(fd), "userfaultfd")
	defer uffd.Close()
	areas, err := registeredAreas(pid)
	if err != nil {
		return false, err
	}
	for _, a := range areas {
		if !a.wpOnly {
			return false, nil
		}
		reg := uffdioRegisterArg{Start: a.start, Len: a.end - a.start, Mode: uffdioRegisterModeWP}
		if err := ioctl(uffd, uffdioRegister, unsafe.Pointer(&reg)); err != nil {
			return false, nil
		}
	}
	return true, nil
}

type registered struct {
	start, end uint64
	wpOnly     bool
}

// registeredAreas lists the areas of pid's memory registered with a
// userfaultfd (VmFlags um, uw, ui in /proc/PID/smaps).
func registeredAreas(pid int) ([]registered, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	var out []registered
	var start, end uint64
	for _, line := range strings.Split(string(b), "\n") {
		if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			var um, uw, ui bool
			for _, f := range strings.Fields(flags) {
				um, uw, ui = um || f == "um", uw || f == "uw", ui || f == "ui"
			}
			if um || uw || ui {
				out = append(out, registered{start, end, uw && !um && !ui})
			}
			continue
		}
		if lo, rest, ok := strings.Cut(line, "-"); ok && !strings.Contains(lo, " ") && !strings.Contains(lo, ":") {
			hi, _, _ := strings.Cut(rest, " ")
			s, err1 := strconv.ParseUint(lo, 16, 64)
			e, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				start, end = s, e
			}
		}
	}
	return out, nil
}

// Collect removes the states in dir whose holder is gone (its source
// ended, or it was killed), and returns their sources, and the locks of
// sources with no state (a capture that failed before its tracking was
// held). A source being captured (its lock held) is left for the next
// time.
func Collect(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		source, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok {
			continue
		}
		lock := filepath.Join(dir, e.Name())
		unlock, locked, err := flock.TryLock(lock)
		if err != nil || !locked {
			continue
		}
		s := &Session{dir: dir, source: source, unlock: unlock}
		b, err := os.ReadFile(s.path())
		var st State
		switch {
		case errors.Is(err, os.ErrNotExist):
			os.Remove(lock)
		case err == nil && (json.Unmarshal(b, &st) != nil || !st.Holder.alive()):
			os.Remove(s.path())
			os.Remove(lock)
			out = append(out, source)
		}
		unlock()
	}
	return out, nil
}
