package criuhooks

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
)

// twinMsg is a plugin message as twin.h lays it out.
func twinMsg(version uint32, pid, twin, errno, cloneUs, parkUs int32, why string) []byte {
	b := make([]byte, twinMsgSize)
	le := binary.LittleEndian
	le.PutUint32(b, version)
	for i, v := range []int32{pid, twin, errno, cloneUs, parkUs} {
		le.PutUint32(b[4+4*i:], uint32(v))
	}
	copy(b[24:], why)
	return b
}

// The collector takes a twin with its two descriptors, and a refusal with
// the plugin's reason; a message of another version or size, or a twin
// without its descriptors, is an error that closes what came with it.
func TestTwinCollectorReadsThePluginsMessages(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &TwinCollector{recv: os.NewFile(uintptr(fds[0]), "recv"), send: fds[1], got: map[int]*Twin{}, done: make(chan struct{})}
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
	send(twinMsg(twinMsgVersion, 100, 200, 0, 1500, 300, ""), r, w)
	send(twinMsg(twinMsgVersion, 101, 0, int32(unix.EAGAIN), 0, 0, "clone in process 101 failed: Resource temporarily unavailable"))
	send(twinMsg(twinMsgVersion+1, 102, 201, 0, 0, 0, ""), r, w)
	send(twinMsg(twinMsgVersion, 103, 202, 0, 0, 0, ""), r)
	left := c.Close()
	if len(left) != 1 || left[0].Pid != 100 || left[0].TwinPid != 200 || left[0].Clone.Microseconds() != 1500 || left[0].Park.Microseconds() != 300 {
		t.Fatalf("twins gathered: %+v, want the twin of 100", left)
	}
	left[0].Close()
	err = c.Err()
	var te *TwinError
	if !errors.As(err, &te) || te.Pid != 101 || !errors.Is(err, unix.EAGAIN) || !strings.Contains(err.Error(), "Resource temporarily unavailable") {
		t.Fatalf("the refusal: %v, want process 101's EAGAIN with the plugin's reason", err)
	}
	if !strings.Contains(err.Error(), "speaks version") {
		t.Errorf("a message of another version was not refused: %v", err)
	}
	if !strings.Contains(err.Error(), "came with 1 descriptors") {
		t.Errorf("a twin without its lifeline was not refused: %v", err)
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
