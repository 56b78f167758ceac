package criuhooks

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timerfd"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/tty"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks/internal/imagetest"
)

func readImage(t *testing.T, path string, entry proto.Message) []proto.Message {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(entry)
	if err != nil {
		t.Fatal(err)
	}
	var out []proto.Message
	for _, e := range img.Entries {
		out = append(out, e.Message)
	}
	return out
}

func tfdEntry(id uint32, vsec, vnsec, isec, insec uint64) *fdinfo.FileEntry {
	return &fdinfo.FileEntry{
		Type: fdinfo.FdTypes_TIMERFD.Enum(),
		Id:   proto.Uint32(id),
		Tfd: &timerfd.TimerfdEntry{
			Id: proto.Uint32(id), Flags: proto.Uint32(0), Clockid: proto.Uint32(1), Ticks: proto.Uint64(1),
			SettimeFlags: proto.Uint32(0), Vsec: proto.Uint64(vsec), Vnsec: proto.Uint64(vnsec),
			Isec: proto.Uint64(isec), Insec: proto.Uint64(insec),
			Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)},
		},
	}
}

// A periodic timerfd caught with no time left is re-armed one interval
// ahead; armed, one-shot and disarmed timers are left as CRIU saw them.
func TestFixupRearmsPeriodicTimerfds(t *testing.T) {
	dir := t.TempDir()
	imagetest.Write(t, filepath.Join(dir, "files.img"), "FILES",
		tfdEntry(1, 0, 0, 0, 10_000_000),         // periodic, caught expired: re-arm
		tfdEntry(2, 0, 5_000_000, 0, 10_000_000), // periodic, armed: keep
		tfdEntry(3, 0, 0, 0, 0),                  // disarmed: keep
		tfdEntry(4, 2, 0, 0, 0),                  // one-shot: keep
	)
	if err := FixupDump(dir); err != nil {
		t.Fatal(err)
	}
	got := readImage(t, filepath.Join(dir, "files.img"), &fdinfo.FileEntry{})
	want := [][2]uint64{{0, 10_000_000}, {0, 5_000_000}, {0, 0}, {2, 0}}
	for i, m := range got {
		tfd := m.(*fdinfo.FileEntry).GetTfd()
		if v := [2]uint64{tfd.GetVsec(), tfd.GetVnsec()}; v != want[i] {
			t.Errorf("timerfd %d: value %v, want %v", i+1, v, want[i])
		}
	}
}

func TestFixupThawsRecordedFreezerState(t *testing.T) {
	dir := t.TempDir()
	frozen := &cgroup.CgroupPropEntry{Name: proto.String("freezer.state"), Value: proto.String("FROZEN")}
	other := &cgroup.CgroupPropEntry{Name: proto.String("cpu.shares"), Value: proto.String("1024")}
	child := &cgroup.CgroupDirEntry{DirName: proto.String("child"), Properties: []*cgroup.CgroupPropEntry{frozen}}
	imagetest.Write(t, filepath.Join(dir, "cgroup.img"), "CGROUP", &cgroup.CgroupEntry{
		Controllers: []*cgroup.CgControllerEntry{{
			Cnames: []string{"freezer"},
			Dirs:   []*cgroup.CgroupDirEntry{{DirName: proto.String("ctr"), Properties: []*cgroup.CgroupPropEntry{other}, Children: []*cgroup.CgroupDirEntry{child}}},
		}},
	})
	if err := FixupDump(dir); err != nil {
		t.Fatal(err)
	}
	got := readImage(t, filepath.Join(dir, "cgroup.img"), &cgroup.CgroupEntry{})[0].(*cgroup.CgroupEntry)
	d := got.GetControllers()[0].GetDirs()[0]
	if v := d.GetChildren()[0].GetProperties()[0].GetValue(); v != "THAWED" {
		t.Errorf("freezer.state %q", v)
	}
	if v := d.GetProperties()[0].GetValue(); v != "1024" {
		t.Errorf("an unrelated property changed to %q", v)
	}
}

func TestFixupWithoutImages(t *testing.T) {
	if err := FixupDump(t.TempDir()); err != nil {
		t.Fatalf("a dump without cgroup or files images: %v", err)
	}
}

func TestLogErrors(t *testing.T) {
	log := filepath.Join(t.TempDir(), "dump.log")
	os.WriteFile(log, []byte(`(00.000100) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.100000) Info everything fine
(00.200000) Error (criu/sk-inet.c:1): inet: Unsupported proto 262
(00.300000) Error (criu/cr-dump.c:2): Dumping FAILED.
`), 0o644)
	got := LogErrors(log)
	if len(got) != 2 || got[0] != "Error (criu/sk-inet.c:1): inet: Unsupported proto 262" {
		t.Fatalf("%q", got)
	}
	// Repeats once; the first error and the last five of a long cascade.
	var b strings.Builder
	for i := 0; i < 5; i++ {
		fmt.Fprintf(&b, "(00.%06d) Error (compel/src/lib/infect.c:262): Unseizable non-zombie 42 found\n", i)
	}
	for i := 0; i < 8; i++ {
		fmt.Fprintf(&b, "(01.%06d) Error (criu/x.c:%d): step %d failed\n", i, i, i)
	}
	os.WriteFile(log, []byte(b.String()), 0o644)
	got = LogErrors(log)
	want := []string{"Error (compel/src/lib/infect.c:262): Unseizable non-zombie 42 found",
		"Error (criu/x.c:3): step 3 failed", "Error (criu/x.c:4): step 4 failed", "Error (criu/x.c:5): step 5 failed",
		"Error (criu/x.c:6): step 6 failed", "Error (criu/x.c:7): step 7 failed"}
	if !slices.Equal(got, want) {
		t.Fatalf("%q\nwant %q", got, want)
	}
}

func pstreeEntry(pid, pgid, sid uint32) *pstree.PstreeEntry {
	return &pstree.PstreeEntry{Pid: proto.Uint32(pid), Ppid: proto.Uint32(1), Pgid: proto.Uint32(pgid), Sid: proto.Uint32(sid)}
}

func ttyEntry(id, sid, pgrp uint32) *tty.TtyInfoEntry {
	return &tty.TtyInfoEntry{
		Id: proto.Uint32(id), Type: tty.TtyType_PTY.Enum(), Locked: proto.Bool(false), Exclusive: proto.Bool(false),
		PacketMode: proto.Bool(false), Sid: proto.Uint32(sid), Pgrp: proto.Uint32(pgrp), Rdev: proto.Uint32(0x8800),
	}
}

// A terminal whose foreground group has no process in the images goes to
// its session leader; a group that has one, a terminal that is no one's
// controlling terminal, and a session whose leader is not in the images
// (a shell job's) are left as CRIU saw them.
func TestFixupGivesAnEmptyForegroundToTheSessionLeader(t *testing.T) {
	dir := t.TempDir()
	imagetest.Write(t, filepath.Join(dir, "pstree.img"), "PSTREE",
		pstreeEntry(1, 1, 1),    // the container's init, a session leader
		pstreeEntry(10, 10, 10), // a tmux pane's shell
		pstreeEntry(11, 11, 10), // its job, in the foreground
		pstreeEntry(20, 20, 20), // another pane's shell; its job is gone
		pstreeEntry(30, 30, 5),  // in a session whose leader is not dumped
	)
	imagetest.Write(t, filepath.Join(dir, "tty-info.img"), "TTY_INFO",
		ttyEntry(1, 10, 11), // foreground job alive: keep
		ttyEntry(2, 20, 21), // foreground group gone: to 20
		ttyEntry(3, 0, 0),   // no one's controlling terminal: keep
		ttyEntry(4, 5, 31),  // leader not dumped: keep
		ttyEntry(5, 1, 7),   // the console, foreground gone: to 1
	)
	if err := FixupDump(dir); err != nil {
		t.Fatal(err)
	}
	want := []uint32{11, 20, 0, 31, 1}
	got := readImage(t, filepath.Join(dir, "tty-info.img"), &tty.TtyInfoEntry{})
	if len(got) != len(want) {
		t.Fatalf("%d terminals read back, want %d", len(got), len(want))
	}
	for i, m := range got {
		e := m.(*tty.TtyInfoEntry)
		if e.GetPgrp() != want[i] || e.GetSid() != []uint32{10, 20, 0, 5, 1}[i] {
			t.Errorf("tty %d: sid %d pgrp %d, want pgrp %d", e.GetId(), e.GetSid(), e.GetPgrp(), want[i])
		}
	}
}
