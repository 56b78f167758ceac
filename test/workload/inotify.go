package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// `workload inotify-unlinked` holds an inotify watch on a file it has
// unlinked, with the file still open, and keeps writing to it: every write
// is an IN_MODIFY event on the watch. It records in its directory how many
// events it has read, so a fork's sibling shows whether its restored watch
// still reports on its restored file. CRIU cannot find such a file by any
// path (it has none), which is what this exercises.

// Names of the files inotify-unlinked keeps in its directory.
const (
	inotifyWatchedName = "watched"
	inotifyEventsName  = "events"
	inotifyReadyName   = "inotify.json"
)

// inotifyState is inotify.json: what a test needs to find the watch in
// /proc/PID/fdinfo.
type inotifyState struct {
	Pid       int `json:"pid"`
	InotifyFd int `json:"inotify_fd"`
	FileFd    int `json:"file_fd"`
	Wd        int `json:"wd"`
}

func cmdInotifyUnlinked(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("inotify-unlinked", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "/var/tmp/inotify", "directory of the watched file and of the reports")
	interval := fs.Duration("interval", 100*time.Millisecond, "time between writes to the watched file")
	keepName := fs.Bool("keep-name", false, "leave the watched file its name (a watch on an ordinary file, for comparison)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		return usagef("--interval must be positive, got %s", *interval)
	}
	w, err := watchFile(*dir, !*keepName)
	if err != nil {
		return err
	}
	for {
		if err := w.step(); err != nil {
			return err
		}
		time.Sleep(*interval)
	}
}

// unlinkedWatch is the watch, the open file and the count of events seen.
type unlinkedWatch struct {
	dir     string
	inotify int
	file    int
	wd      int
	events  int
}

// watchFile creates dir/watched, opens it, watches it and, with unlink,
// unlinks it.
func watchFile(dir string, unlink bool) (*unlinkedWatch, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, inotifyWatchedName)
	file, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", path, err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	wd, err := unix.InotifyAddWatch(in, path, unix.IN_MODIFY)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	if unlink {
		if err := unix.Unlink(path); err != nil {
			return nil, fmt.Errorf("unlinking %s: %w", path, err)
		}
	}
	w := &unlinkedWatch{dir: dir, inotify: in, file: file, wd: wd}
	if err := w.writeEvents(); err != nil {
		return nil, err
	}
	state, _ := json.Marshal(inotifyState{Pid: os.Getpid(), InotifyFd: in, FileFd: file, Wd: wd})
	if err := writeFileAtomic(filepath.Join(dir, inotifyReadyName), state); err != nil {
		return nil, err
	}
	return w, nil
}

// step writes to the file and counts the events that came of it.
func (w *unlinkedWatch) step() error {
	if _, err := unix.Pwrite(w.file, []byte{'x'}, 0); err != nil {
		return fmt.Errorf("writing to the unlinked file: %w", err)
	}
	n, err := w.readEvents()
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	w.events += n
	return w.writeEvents()
}

// readEvents returns how many IN_MODIFY events of the watch are queued.
func (w *unlinkedWatch) readEvents() (int, error) {
	buf := make([]byte, 64*unix.SizeofInotifyEvent)
	n, err := unix.Read(w.inotify, buf)
	if err == unix.EAGAIN {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading inotify events: %w", err)
	}
	return countModify(buf[:n], w.wd), nil
}

// countModify counts the IN_MODIFY events of wd in a read of inotify
// events.
func countModify(buf []byte, wd int) int {
	count := 0
	for len(buf) >= unix.SizeofInotifyEvent {
		evWd := int32(binary.NativeEndian.Uint32(buf[0:4]))
		mask := binary.NativeEndian.Uint32(buf[4:8])
		nameLen := int(binary.NativeEndian.Uint32(buf[12:16]))
		if int(evWd) == wd && mask&unix.IN_MODIFY != 0 {
			count++
		}
		next := unix.SizeofInotifyEvent + nameLen
		if next > len(buf) {
			break
		}
		buf = buf[next:]
	}
	return count
}

func (w *unlinkedWatch) writeEvents() error {
	return writeFileAtomic(filepath.Join(w.dir, inotifyEventsName), []byte(strconv.Itoa(w.events)+"\n"))
}
