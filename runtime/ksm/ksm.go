// Package ksm lets siblings share their identical pages without the
// vma_cherrypick module: the kernel's samepage merging (KSM) merges the
// memory of processes marked mergeable as a whole (PR_SET_MEMORY_MERGE,
// Linux 6.4; kept across execve since 6.7).
//
// A mark is set on a process and inherited by everything it forks and
// execs, so tclone marks itself just before it runs crun: crun, CRIU and the
// container's processes are mergeable from their first instruction.
//
// ksmd, the kernel thread that merges, is off or slow on most hosts. While
// young forks that asked for merging exist, tclone turns it on and up, and
// puts back the host's own settings afterwards, even after a crash: they are
// saved on disk before anything is changed, and restored by `tclone gc`, by
// the next fork, or by a settle process that waits for the forks to age.
package ksm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/flock"
	"github.com/tclone/tclone/runtime/procfs"
)

// Linux's prctl options for merging a whole process.
const (
	prSetMemoryMerge = 67
	prGetMemoryMerge = 68
)

// SysDir is where the kernel exposes ksmd's settings.
var SysDir = "/sys/kernel/mm/ksm"

// Available tells whether this host can merge whole processes, and if not,
// why, in words a user can act on.
func Available() error {
	if _, err := os.Stat(filepath.Join(SysDir, "run")); err != nil {
		return fmt.Errorf("this kernel has no KSM (%s is missing: CONFIG_KSM)", SysDir)
	}
	if _, err := unix.PrctlRetInt(prGetMemoryMerge, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("this kernel cannot mark a whole process mergeable (PR_SET_MEMORY_MERGE needs Linux 6.4, and 6.7 to keep it across exec): %w", err)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	if release := unix.ByteSliceToString(u.Release[:]); !keepsMergeAcrossExec(release) {
		return fmt.Errorf("kernel %s drops the mergeable mark at exec (kept since Linux 6.7), so a container's processes would not be mergeable", release)
	}
	return nil
}

// keepsMergeAcrossExec tells whether a kernel release is 6.7 or later.
func keepsMergeAcrossExec(release string) bool {
	var major, minor int
	if n, _ := fmt.Sscanf(release, "%d.%d", &major, &minor); n != 2 {
		return false
	}
	return major > 6 || major == 6 && minor >= 7
}

// MarkSelf marks the calling process mergeable, and with it everything it
// forks and execs from now on.
func MarkSelf() error {
	if err := unix.Prctl(prSetMemoryMerge, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("marking memory mergeable (PR_SET_MEMORY_MERGE): %w", err)
	}
	return nil
}

// Marked reports whether process pid is marked mergeable as a whole
// (/proc/PID/ksm_stat: "ksm_merge_any: yes").
func Marked(pid int) (bool, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", pid))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "ksm_merge_any:"); ok {
			return strings.TrimSpace(v) == "yes", nil
		}
	}
	return false, fmt.Errorf("/proc/%d/ksm_stat does not say whether it merges as a whole", pid)
}

// Settings are the ksmd settings tclone changes.
type Settings struct {
	Run            int `json:"run"`
	PagesToScan    int `json:"pages_to_scan"`
	SleepMillisecs int `json:"sleep_millisecs"`
}

// Boosted is what ksmd runs with while young forks exist: about 100 000
// pages (400 MiB) a second, so that a sibling of a few GiB converges in
// about a minute. It costs CPU while it scans: a 512 MiB source and its
// sibling took 3.7 s of ksmd's CPU over the 10 s they took to converge.
var Boosted = Settings{Run: 1, PagesToScan: 2000, SleepMillisecs: 20}

func read() (Settings, error) {
	var s Settings
	for name, v := range map[string]*int{"run": &s.Run, "pages_to_scan": &s.PagesToScan, "sleep_millisecs": &s.SleepMillisecs} {
		data, err := os.ReadFile(filepath.Join(SysDir, name))
		if err != nil {
			return s, err
		}
		if *v, err = strconv.Atoi(strings.TrimSpace(string(data))); err != nil {
			return s, fmt.Errorf("%s/%s: %w", SysDir, name, err)
		}
	}
	return s, nil
}

func write(s Settings) error {
	// The scan rate first, so that a ksmd turned on never runs at a
	// rate nobody chose.
	for _, kv := range []struct {
		name string
		v    int
	}{{"pages_to_scan", s.PagesToScan}, {"sleep_millisecs", s.SleepMillisecs}, {"run", s.Run}} {
		if err := os.WriteFile(filepath.Join(SysDir, kv.name), []byte(strconv.Itoa(kv.v)), 0); err != nil {
			return fmt.Errorf("setting %s/%s: %w", SysDir, kv.name, err)
		}
	}
	return nil
}

// Tuner turns ksmd up for young forks and back down. Dir holds the host's
// saved settings and a marker per fork (on disk: a crash or a reboot must
// not lose the host's settings).
type Tuner struct {
	Dir string
	// Window is how long after its last fork a sibling counts as young.
	Window time.Duration
	// Alive tells whether a fork's sibling still exists; a gone sibling
	// is not young.
	Alive func(id string) bool
}

// DefaultWindow is how long ksmd stays up after the last merging fork.
const DefaultWindow = 5 * time.Minute

const savedFile = "host-settings.json"

// saved is the host's settings as they were before the first boost, and
// the boot they belong to: a reboot resets ksmd, and settings saved before
// it must not be written over whatever the host set since.
type saved struct {
	Settings
	BootID string `json:"boot_id"`
}

// readSaved returns the host's saved settings of this boot, if any, and
// drops those of an earlier boot.
func (t Tuner) readSaved() (*Settings, error) {
	path := filepath.Join(t.Dir, savedFile)
	var s saved
	if err := atomicfile.ReadJSON(path, &s); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	if boot, _ := procfs.BootID(); s.BootID != boot {
		return nil, os.Remove(path)
	}
	return &s.Settings, nil
}

func (t Tuner) lock() (func(), error) {
	if err := os.MkdirAll(t.Dir, 0o700); err != nil {
		return nil, err
	}
	return flock.Lock(context.Background(), filepath.Join(t.Dir, "lock"))
}

// Young records a merging fork of sibling id and turns ksmd up, saving the
// host's own settings first unless they are saved already.
func (t Tuner) Young(id string) error {
	unlock, err := t.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := atomicfile.WriteFile(filepath.Join(t.Dir, "young-"+id), nil, 0o600); err != nil {
		return err
	}
	prev, err := t.readSaved()
	if err != nil {
		return err
	}
	if prev == nil {
		host, err := read()
		if err != nil {
			return err
		}
		boot, err := procfs.BootID()
		if err != nil {
			return err
		}
		if err := atomicfile.WriteJSON(filepath.Join(t.Dir, savedFile), saved{Settings: host, BootID: boot}, 0o600); err != nil {
			return err
		}
	}
	cur, err := read()
	if err != nil {
		return err
	}
	want := Settings{Run: 1, PagesToScan: max(cur.PagesToScan, Boosted.PagesToScan), SleepMillisecs: min(cur.SleepMillisecs, Boosted.SleepMillisecs)}
	if cur == want {
		return nil
	}
	return write(want)
}

// Settle puts the host's settings back once no fork is young, and reports
// when to look again (0: nothing left to wait for).
func (t Tuner) Settle(now time.Time) (time.Duration, error) {
	if _, err := os.Stat(t.Dir); errors.Is(err, os.ErrNotExist) {
		return 0, nil // never boosted
	}
	unlock, err := t.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	markers, _ := filepath.Glob(filepath.Join(t.Dir, "young-*"))
	var next time.Duration
	for _, m := range markers {
		st, err := os.Stat(m)
		if err != nil {
			continue
		}
		left := t.Window - now.Sub(st.ModTime())
		id := strings.TrimPrefix(filepath.Base(m), "young-")
		if left <= 0 || (t.Alive != nil && !t.Alive(id)) {
			os.Remove(m)
			continue
		}
		next = max(next, left)
	}
	if next > 0 {
		return next, nil
	}
	host, err := t.readSaved()
	if err != nil || host == nil {
		return 0, err
	}
	if err := write(*host); err != nil {
		return 0, err
	}
	return 0, os.Remove(filepath.Join(t.Dir, savedFile))
}
