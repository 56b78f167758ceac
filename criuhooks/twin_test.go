package criuhooks

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
	"github.com/tclone/tclone/runtime/procfs"
)

// twinMsg is a plugin message as twin.h lays it out, with nspid the
// process's pids from the host's PID namespace down (pid first).
func twinMsg(version uint32, pid, twin, errno, cloneUs int32, why string, nspid ...int32) []byte {
	b := make([]byte, twinMsgSize)
	le := binary.LittleEndian
	le.PutUint32(b, version)
	for i, v := range []int32{pid, twin, errno, cloneUs} {
		le.PutUint32(b[4+4*i:], uint32(v))
	}
	copy(b[twinWhyOff:], why)
	if errno == 0 && len(nspid) == 0 {
		nspid = []int32{pid}
	}
	ns := b[twinWhyOff+twinWhyLen:]
	le.PutUint32(ns, uint32(len(nspid)))
	for i, v := range nspid {
		le.PutUint32(ns[4+4*i:], uint32(v))
	}
	return b
}

// trackMsg is a plugin message of the tracking kind: process pid's
// userfaultfd (track 1, sent with it), or why it has none (-errno).
func trackMsg(pid, track int32) []byte {
	b := twinMsg(twinMsgVersion, pid, 0, 0, 0, "")
	ns := b[twinWhyOff+twinWhyLen:]
	binary.LittleEndian.PutUint32(ns, 0)
	binary.LittleEndian.PutUint32(ns[4+4*twinNSMax:], uint32(track))
	binary.LittleEndian.PutUint32(ns[8+4*twinNSMax:], twinKindTrack)
	return b
}

// The collector takes a twin with its two descriptors, and a refusal with
// the plugin's reason (and the twin it killed, if any: KilledTwins); a
// message of another version or size, or a twin without its descriptors,
// is an error that closes what came with it. A
// process's userfaultfd, or why it has none, comes in a message of its
// own, before the twin's: Uffds hands them over.
func TestTwinCollectorReadsThePluginsMessages(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &TwinCollector{recv: os.NewFile(uintptr(fds[0]), "recv"), send: fds[1], got: map[int]*Twin{}, tracks: map[int]*Twin{},
		done: make(chan struct{})}
	go c.gather()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	send := func(msg []byte, files ...*os.File) {
		var rights []byte
		if len(files) > 0 {
			var fdl []int
			for _, f := range files {
				fdl = append(fdl, int(f.Fd()))
			}
			rights = unix.UnixRights(fdl...)
		}
		if err := unix.Sendmsg(fds[1], msg, rights, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	send(twinMsg(twinMsgVersion, 100, 200, 0, 1500, "", 100, 7), r, w)
	send(twinMsg(twinMsgVersion, 101, 0, int32(unix.EAGAIN), 0, "clone in process 101 failed: Resource temporarily unavailable"))
	send(twinMsg(twinMsgVersion, 106, 206, int32(unix.ESRCH), 0, "waiting for the twin 206: No such process"))
	send(twinMsg(twinMsgVersion+1, 102, 201, 0, 0, ""), r, w)
	send(twinMsg(twinMsgVersion, 103, 202, 0, 0, ""), r)
	send(trackMsg(100, 1), w)
	send(trackMsg(104, -int32(unix.EPERM)))
	send(trackMsg(105, 1))
	uffds, trackErrs := c.Uffds()
	if len(uffds) != 1 || uffds[100] == nil || len(trackErrs) != 1 || !errors.Is(trackErrs[104], unix.EPERM) {
		t.Fatalf("userfaultfds %v, errors %v: want 100's, and 104's EPERM", uffds, trackErrs)
	}
	uffds[100].Close()
	left := c.Close()
	if len(left) != 1 || left[0].Pid != 100 || left[0].TwinPid != 200 || left[0].Clone.Microseconds() != 1500 ||
		len(left[0].NSpid) != 2 || left[0].NSpid[1] != 7 {
		t.Fatalf("twins gathered: %+v, want the twin of 100", left)
	}
	left[0].Close()
	err = c.Err()
	var te *TwinError
	if !errors.As(err, &te) || te.Pid != 101 || !errors.Is(err, unix.EAGAIN) || !strings.Contains(err.Error(), "Resource temporarily unavailable") {
		t.Fatalf("the refusal: %v, want process 101's EAGAIN with the plugin's reason", err)
	}
	if k := c.KilledTwins(); len(k) != 1 || k[0].Pid != 106 || k[0].Killed != 206 {
		t.Errorf("the twins the plugin killed: %+v, want 106's twin 206 alone", k)
	}
	if !strings.Contains(err.Error(), "speaks version") {
		t.Errorf("a message of another version was not refused: %v", err)
	}
	if !strings.Contains(err.Error(), "came with 1 descriptors") {
		t.Errorf("a twin without its lifeline was not refused: %v", err)
	}
	if !strings.Contains(err.Error(), "the tracking of 105") {
		t.Errorf("a userfaultfd message without its descriptor was not refused: %v", err)
	}
}

// The plugin's socket queues the messages of a thousand processes, each
// with its twin's descriptors, while nobody reads them: the plugin sends
// them while CRIU holds the tree, and must not wait for tclone there.
func TestTwinSocketQueuesAThousandProcesses(t *testing.T) {
	fds, err := twinSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rights := unix.UnixRights(int(r.Fd()), int(w.Fd()))
	for i := range 1000 {
		msg := twinMsg(twinMsgVersion, int32(100+i), int32(5000+i), 0, 0, "")
		if err := unix.Sendmsg(fds[1], msg, rights, nil, unix.MSG_DONTWAIT); err != nil {
			t.Fatalf("message %d: %v: the plugin would wait for tclone while CRIU holds the tree", i+1, err)
		}
	}
}

func twinVMA(start, end uint64, madv uint64) *vma.VmaEntry {
	return &vma.VmaEntry{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0),
		Shmid: proto.Uint64(0), Prot: proto.Uint32(3), Flags: proto.Uint32(0x22), Status: proto.Uint32(vmaAnonPrivate | 1),
		Fd: proto.Int64(-1), Madv: proto.Uint64(madv)}
}

// madvWipeOnFork is MADV_WIPEONFORK as CRIU records it in a VMA's madv.
const madvWipeOnFork = 1 << 18

// Memory fork() does not copy refuses the twin capture, naming the process
// and the area; memory fork() wipes, and other madvise flags, do not.
func TestCheckTwinnable(t *testing.T) {
	z := proto.Uint64(0)
	write := func(dir string, vmas ...*vma.VmaEntry) {
		imagetest.Write(t, filepath.Join(dir, "mm-1.img"), "MM", &mm.MmEntry{MmStartCode: z, MmEndCode: z, MmStartData: z,
			MmEndData: z, MmStartStack: z, MmStartBrk: z, MmBrk: z, MmArgStart: z, MmArgEnd: z, MmEnvStart: z, MmEnvEnd: z,
			ExeFileId: proto.Uint32(0), Vmas: vmas})
	}
	tasks := []Task{{ImagePid: 1, HostPid: 4242}}
	for _, c := range []struct {
		madv uint64
		want string
	}{
		{0, ""},
		{1 << 14, ""}, // MADV_HUGEPAGE
		{madvDontFork, "MADV_DONTFORK"},
		{madvWipeOnFork, ""},
	} {
		dir := t.TempDir()
		write(dir, twinVMA(0x1000, 0x2000, 0), twinVMA(0x10000, 0x20000, c.madv))
		err := CheckTwinnable(dir, append(tasks, Task{ImagePid: 9, HostPid: 9}))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("madv %#x: %v", c.madv, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "4242") || !strings.Contains(err.Error(), "0x10000")):
			t.Errorf("madv %#x: %v, want a refusal naming %s, process 4242 and its area", c.madv, err, c.want)
		}
	}
}

// A message of a twin without its PID namespace levels, or with more than
// the plugin sends, is refused.
func TestTwinMessageNamespaceLevels(t *testing.T) {
	for _, levels := range []uint32{0, twinNSMax + 1} {
		b := twinMsg(twinMsgVersion, 100, 200, 0, 0, "")
		binary.LittleEndian.PutUint32(b[twinWhyOff+twinWhyLen:], levels)
		if _, _, err := parseTwinMsg(b, nil); err == nil || !strings.Contains(err.Error(), "PID namespace levels") {
			t.Errorf("%d levels: %v, want a refusal", levels, err)
		}
	}
}

// Take matches each process of the images that has memory with its twin
// by the pid the images give it (the twin's pid at the root's level of
// PID namespaces), opens the twin's memory, and skips zombies (no mm
// image); a process of the images without a twin fails it, and the twins
// go back to the collector.
func TestTwinCollectorTakeMatchesTheImages(t *testing.T) {
	var twins []*Twin
	for range 2 {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		twins = append(twins, &Twin{TwinPid: cmd.Process.Pid, Pidfd: os.NewFile(uintptr(fd), "pidfd")})
	}
	// The root, host pid 4001, is pid 1 of the container; 4005 is its pid 5.
	twins[0].Pid, twins[0].NSpid = 4001, []int{4001, 1}
	twins[1].Pid, twins[1].NSpid = 4005, []int{4005, 5}
	images := func(pids ...uint32) string {
		dir := t.TempDir()
		var entries []proto.Message
		for _, p := range pids {
			entries = append(entries, &pstree.PstreeEntry{Pid: proto.Uint32(p), Ppid: proto.Uint32(1), Pgid: proto.Uint32(1), Sid: proto.Uint32(1)})
			if p != 6 { // 6 is a zombie
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("mm-%d.img", p)), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		imagetest.Write(t, filepath.Join(dir, "pstree.img"), "PSTREE", entries...)
		return dir
	}
	collector := func() *TwinCollector {
		c := &TwinCollector{got: map[int]*Twin{}, done: make(chan struct{})}
		close(c.done)
		for _, tw := range twins {
			c.got[tw.Pid] = tw
		}
		return c
	}

	c := collector()
	if _, err := c.Take(4001, images(1, 5, 6, 7)); err == nil || !strings.Contains(err.Error(), "process 7 of the images has no twin") {
		t.Fatalf("Take with a process lacking a twin: %v", err)
	}
	if len(c.got) != 2 {
		t.Fatalf("after a failed Take the collector holds %d twins, want both back", len(c.got))
	}
	if _, err := collector().Take(4999, images(1, 5)); err == nil || !strings.Contains(err.Error(), "root, process 4999, has no twin") {
		t.Fatalf("Take of a root without a twin: %v", err)
	}

	// A twin killed after the thaw (a zombie: nobody reaps a twin but
	// tclone) has no memory left to read.
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	dead := &Twin{Pid: 4008, NSpid: []int{4008, 8}, TwinPid: cmd.Process.Pid, Pidfd: os.NewFile(uintptr(fd), "pidfd")}
	defer dead.Pidfd.Close()
	cmd.Process.Kill()
	defer cmd.Wait()
	if _, err := procfs.PidfdExited(fd, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	c = collector()
	c.got[dead.Pid] = dead
	if _, err := c.Take(4001, images(1, 5, 8)); !errors.Is(err, ErrTwinGone) || !strings.Contains(err.Error(), "process 4008") {
		t.Fatalf("Take with a dead twin: %v, want ErrTwinGone naming process 4008", err)
	}

	c = collector()
	s, err := c.Take(4001, images(1, 5, 6))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Snapshots.Close()
	if len(s.Twins) != 2 || s.Twins[1] != twins[0] || s.Twins[5] != twins[1] || s.Files[1] == nil || s.Files[5] == nil || len(c.got) != 0 {
		t.Fatalf("taken: twins %v, memory %v; left %v", s.Twins, s.Files, c.got)
	}
}
