// Package procfs reads what tclone needs from /proc: the processes there,
// a process's stat and status, its threads and their children, its command
// line, the boot's ID, and the calling process's cgroups.
package procfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Stat is what tclone reads of /proc/PID/stat.
type Stat struct {
	// Comm is the command name (field 2), without its parentheses.
	Comm string
	// State is the state letter (field 3): R, S, D, Z, X, ...
	State byte
	// PPid is the parent's PID (field 4).
	PPid int
	// StartTime is when the process started, in clock ticks since boot
	// (field 22). With the PID it names a process even after PID reuse.
	StartTime uint64
	// ExitSignal is the signal the parent gets when the process exits
	// (field 38); 0 for a process whose exit signals no one.
	ExitSignal int
}

// Exited reports a process that has exited but is not reaped yet (a
// zombie) or is being reaped: it holds nothing any more.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// readProc reads /proc/PID/name. A process reaped between the open and the
// read is gone, as one that was not there: the error wraps os.ErrNotExist.
func readProc(pid int, name string) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
	if errors.Is(err, syscall.ESRCH) {
		return "", fmt.Errorf("%w: %w", os.ErrNotExist, err)
	}
	return string(data), err
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	data, err := readProc(pid, "stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(data)
}

// ReadTaskStat reads /proc/PID/task/TID/stat, thread tid's of process pid.
func ReadTaskStat(pid, tid int) (Stat, error) {
	data, err := readProc(pid, fmt.Sprintf("task/%d/stat", tid))
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(data)
}

// ParseStat parses the content of a /proc/PID/stat file.
func ParseStat(s string) (Stat, error) {
	// The command name (field 2) may hold spaces and parentheses: it runs
	// from the first '(' to the last ')', and the other fields follow.
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Stat{}, errors.New("malformed stat")
	}
	fields := strings.Fields(s[end+1:])
	// fields[0] is field 3.
	if len(fields) < 36 || len(fields[0]) != 1 {
		return Stat{}, errors.New("short stat")
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return Stat{}, fmt.Errorf("stat: parent pid: %w", err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("stat: start time: %w", err)
	}
	exitSignal, err := strconv.Atoi(fields[35])
	if err != nil {
		return Stat{}, fmt.Errorf("stat: exit signal: %w", err)
	}
	return Stat{Comm: s[open+1 : end], State: fields[0][0], PPid: ppid, StartTime: start, ExitSignal: exitSignal}, nil
}

// Status is what tclone reads of /proc/PID/status; a field whose line the
// kernel did not write is zero.
type Status struct {
	// Name is the command name.
	Name string
	// Tgid is the process a thread belongs to (its thread group).
	Tgid int
	// TracerPid is the process tracing this one; 0 when none.
	TracerPid int
	// Uid and Gid are the real, effective, saved and filesystem IDs.
	Uid, Gid [4]int
	// NSpid is the PID in each PID namespace the process is in, from the
	// outermost in.
	NSpid []int
	// CapEff is the effective capability set, bit c for capability c.
	CapEff uint64
	// RssAnon is the resident private anonymous memory, in bytes.
	RssAnon uint64
}

// ReadStatus reads /proc/PID/status (PID may be a thread's).
func ReadStatus(pid int) (Status, error) {
	data, err := readProc(pid, "status")
	if err != nil {
		return Status{}, err
	}
	return ParseStatus(data)
}

// NSpid reads the NSpid line of /proc/PID/status: the PID in each PID
// namespace the process is in, from the outermost in.
func NSpid(pid int) ([]int, error) {
	st, err := ReadStatus(pid)
	if err != nil {
		return nil, err
	}
	if len(st.NSpid) == 0 {
		return nil, fmt.Errorf("no NSpid in /proc/%d/status", pid)
	}
	return st.NSpid, nil
}

// ParseStatus parses the content of a /proc/PID/status file. The lines it
// does not know are skipped; one it knows that does not read as the kernel
// writes it is an error.
func ParseStatus(s string) (Status, error) {
	var st Status
	for _, line := range strings.Split(s, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		var err error
		switch key {
		case "Name":
			st.Name = val
		case "Tgid":
			st.Tgid, err = strconv.Atoi(val)
		case "TracerPid":
			st.TracerPid, err = strconv.Atoi(val)
		case "Uid", "Gid":
			var ids []int
			if ids, err = ints(val); err == nil && len(ids) != 4 {
				err = fmt.Errorf("%d IDs, want 4", len(ids))
			}
			if key == "Uid" {
				copy(st.Uid[:], ids)
			} else {
				copy(st.Gid[:], ids)
			}
		case "NSpid":
			st.NSpid, err = ints(val)
		case "CapEff":
			st.CapEff, err = strconv.ParseUint(val, 16, 64)
		case "RssAnon":
			kib, ok := strings.CutSuffix(val, " kB")
			if !ok {
				err = fmt.Errorf("%q is not in kB", val)
				break
			}
			st.RssAnon, err = strconv.ParseUint(strings.TrimSpace(kib), 10, 64)
			st.RssAnon <<= 10
		}
		if err != nil {
			return Status{}, fmt.Errorf("status: %s: %w", key, err)
		}
	}
	return st, nil
}

// ints parses a list of decimal numbers separated by white space.
func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Fields(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Cmdline reads /proc/PID/cmdline: the process's arguments, program
// first; none for a zombie or a kernel thread.
func Cmdline(pid int) ([]string, error) {
	data, err := readProc(pid, "cmdline")
	if err != nil || data == "" {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(data, "\x00"), "\x00"), nil
}

// BootID returns the kernel's ID of the current boot, without the newline
// the kernel ends it with.
func BootID() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(data)), err
}

// Cgroup is one line of /proc/PID/cgroup: the process's cgroup in one
// hierarchy.
type Cgroup struct {
	// ID is the hierarchy's ID; 0 is cgroup v2.
	ID int
	// Controllers are the v1 hierarchy's controllers, comma-separated as
	// the kernel lists them ("cpu,cpuacct", "name=systemd"); empty on v2.
	Controllers string
	// Path is the cgroup's path within the hierarchy.
	Path string
}

// SelfCgroups reads /proc/self/cgroup.
func SelfCgroups() ([]Cgroup, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	return ParseCgroups(string(data)), nil
}

// ParseCgroups parses the content of a /proc/PID/cgroup file, skipping
// lines it cannot read.
func ParseCgroups(s string) []Cgroup {
	var out []Cgroup
	for _, line := range strings.Split(s, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		id, err := strconv.Atoi(parts[0])
		if err != nil {
			continue
		}
		out = append(out, Cgroup{ID: id, Controllers: parts[1], Path: parts[2]})
	}
	return out
}

// Holders lists the processes (other than the caller) with a descriptor
// open on dir or on anything below it, removed or not.
func Holders(dir string) []int {
	dir = strings.TrimSuffix(dir, "/")
	self := os.Getpid()
	var out []int
	pids, _ := Pids()
	for _, pid := range pids {
		if pid == self {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err != nil {
				continue
			}
			link = strings.TrimSuffix(link, " (deleted)")
			if link == dir || strings.HasPrefix(link, dir+"/") {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// Exists reports whether a process with this PID exists and has not
// exited (a zombie holds nothing).
func Exists(pid int) bool {
	st, err := ReadStat(pid)
	return err == nil && !st.Exited()
}

// Tree lists pid and its descendants (through every thread's children),
// parents before children. A process that exits meanwhile may be listed.
func Tree(pid int) []int {
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		pids = append(pids, Children(pids[i])...)
	}
	return pids
}

// Children lists the children of every thread of pid (zombies included,
// until reaped); none if pid is gone.
func Children(pid int) []int {
	var out []int
	tids, _ := Threads(pid)
	for _, tid := range tids {
		kids, _ := TaskChildren(pid, tid)
		out = append(out, kids...)
	}
	return out
}

// Pids lists the processes in /proc (thread group leaders: the other
// threads are not listed there).
func Pids() ([]int, error) {
	return numbered("/proc")
}

// Threads lists the threads of process pid (/proc/PID/task).
func Threads(pid int) ([]int, error) {
	return numbered(fmt.Sprintf("/proc/%d/task", pid))
}

// TaskChildren lists the children of thread tid of process pid
// (/proc/PID/task/TID/children): the processes it is the parent of, zombies
// included until reaped.
func TaskChildren(pid, tid int) ([]int, error) {
	data, err := readProc(pid, fmt.Sprintf("task/%d/children", tid))
	if err != nil {
		return nil, err
	}
	return ints(data)
}

// numbered lists the numbers that name entries of dir.
func numbered(dir string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
