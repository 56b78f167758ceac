// Package procfs reads what tclone needs from /proc: a process's state,
// parent and start time, the boot's ID, and the calling process's cgroups.
package procfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Stat is what tclone reads of /proc/PID/stat.
type Stat struct {
	// State is the state letter (field 3): R, S, D, Z, X, ...
	State byte
	// PPid is the parent's PID (field 4).
	PPid int
	// StartTime is when the process started, in clock ticks since boot
	// (field 22). With the PID it names a process even after PID reuse.
	StartTime uint64
}

// Exited reports a process that has exited but is not reaped yet (a
// zombie) or is being reaped: it holds nothing any more.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, syscall.ESRCH) {
		// Reaped between the open and the read: gone, as ENOENT is.
		return Stat{}, fmt.Errorf("%w: %w", os.ErrNotExist, err)
	}
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(string(data))
}

// ParseStat parses the content of a /proc/PID/stat file.
func ParseStat(s string) (Stat, error) {
	// The command name (field 2) may hold spaces and parentheses: the
	// other fields start after its last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, errors.New("malformed stat")
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3.
	if len(fields) < 20 || len(fields[0]) != 1 {
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
	return Stat{State: fields[0][0], PPid: ppid, StartTime: start}, nil
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
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
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
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
