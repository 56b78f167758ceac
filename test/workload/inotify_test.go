package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The watch outlives the file's name: writes through the open descriptor
// are still reported, and the count is kept in the directory.
func TestUnlinkedWatchCountsEvents(t *testing.T) {
	dir := t.TempDir()
	w, err := watchFile(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		unix.Close(w.inotify)
		unix.Close(w.file)
	}()
	if _, err := os.Stat(filepath.Join(dir, inotifyWatchedName)); !os.IsNotExist(err) {
		t.Fatalf("the watched file still has its name: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := w.step(); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(filepath.Join(dir, inotifyEventsName))
	if n, _ := strconv.Atoi(strings.TrimSpace(string(data))); n < 1 {
		t.Fatalf("events file %q after three writes", data)
	}
	var st inotifyState
	raw, _ := os.ReadFile(filepath.Join(dir, inotifyReadyName))
	if err := json.Unmarshal(raw, &st); err != nil || st.Pid != os.Getpid() || st.Wd != w.wd || st.InotifyFd != w.inotify {
		t.Fatalf("state %s: %v", raw, err)
	}
}

func TestCountModify(t *testing.T) {
	ev := func(wd int32, mask uint32, name string) []byte {
		b := make([]byte, 16+len(name))
		putU32 := func(off int, v uint32) {
			b[off], b[off+1], b[off+2], b[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		putU32(0, uint32(wd))
		putU32(4, mask)
		putU32(12, uint32(len(name)))
		copy(b[16:], name)
		return b
	}
	var buf []byte
	buf = append(buf, ev(1, 0x2, "")...)
	buf = append(buf, ev(2, 0x2, "other\x00\x00\x00")...)
	buf = append(buf, ev(1, 0x4, "")...)
	buf = append(buf, ev(1, 0x2, "")...)
	if got := countModify(buf, 1); got != 2 {
		t.Fatalf("counted %d IN_MODIFY events of wd 1, want 2", got)
	}
}
