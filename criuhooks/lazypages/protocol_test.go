package lazypages

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeRestore is the sending side of a lazy-pages connection, writing
// exactly what criu/uffd.c's send_uffd and lazy_pages_finish_restore write.
type fakeRestore struct {
	t  *testing.T
	fd int
}

func newFakeRestore(t *testing.T) (*fakeRestore, *criuConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "daemon end")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := newCriuConn(c.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); unix.Close(fds[0]) })
	return &fakeRestore{t: t, fd: fds[0]}, cc
}

func (r *fakeRestore) word(v uint32) {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	if _, err := unix.Write(r.fd, b[:]); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRestore) task(pid int32, fd int) {
	r.word(uint32(pid))
	if err := unix.Sendmsg(r.fd, []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
		r.t.Fatal(err)
	}
}

func TestCriuConnReadsTasksZombiesAndFinish(t *testing.T) {
	r, cc := newFakeRestore(t)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	r.task(1, int(devnull.Fd()))
	r.word(uint32(0xffffffff - 6)) // -7: a zombie
	r.task(12, int(devnull.Fd()))
	r.word(restoreFinished)

	msg, err := cc.next()
	if err != nil || msg.kind != msgTask || msg.pid != 1 || msg.sender != os.Getpid() {
		t.Fatalf("first message = %+v, %v; want task 1 sent by pid %d", msg, err, os.Getpid())
	}
	fd, err := cc.uffd()
	if err != nil {
		t.Fatal(err)
	}
	var st1, st2 unix.Stat_t
	unix.Fstat(fd, &st1)
	unix.Fstat(int(devnull.Fd()), &st2)
	unix.Close(fd)
	if st1.Rdev != st2.Rdev {
		t.Fatal("the descriptor received is not the one sent")
	}
	if msg, err := cc.next(); err != nil || msg.kind != msgZombie || msg.pid != 7 {
		t.Fatalf("second message = %+v, %v; want zombie 7", msg, err)
	}
	if msg, err := cc.next(); err != nil || msg.kind != msgTask || msg.pid != 12 {
		t.Fatalf("third message = %+v, %v; want task 12", msg, err)
	}
	fd, err = cc.uffd()
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if msg, err := cc.next(); err != nil || msg.kind != msgFinished {
		t.Fatalf("last message = %+v, %v; want restore-finished", msg, err)
	}
}

func TestCriuConnEOF(t *testing.T) {
	r, cc := newFakeRestore(t)
	unix.Close(r.fd)
	if _, err := cc.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("next at EOF: %v", err)
	}
}

func TestCriuConnTruncatedHeader(t *testing.T) {
	r, cc := newFakeRestore(t)
	unix.Write(r.fd, []byte{1, 0})
	unix.Close(r.fd)
	if _, err := cc.next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("next on half a header: %v", err)
	}
}

func TestCriuConnTaskWithoutDescriptor(t *testing.T) {
	r, cc := newFakeRestore(t)
	r.word(3)
	unix.Write(r.fd, []byte{0})
	if _, err := cc.next(); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.uffd(); err == nil {
		t.Fatal("a task without a userfaultfd was accepted")
	}
}

// A restore's task may send its userfaultfd the moment the daemon has
// accepted the connection, before the daemon has done anything with it:
// the message must still name its sender (the daemon's listener passes
// SO_PASSCRED on to what it accepts), or the task could not be killed if
// its memory cannot be completed.
func TestMessagesRightAfterAcceptNameTheirSender(t *testing.T) {
	path := t.TempDir() + "/lazy-pages.socket"
	l, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Sent after the accept, read without any further set-up.
	if err := unix.Sendmsg(fd, []byte{1}, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	_, oobn, _, _, err := c.ReadMsgUnix(make([]byte, 1), oob)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("no credentials came with the message (%d control messages, %v)", len(msgs), err)
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil || int(cred.Pid) != os.Getpid() {
		t.Fatalf("credentials %+v, %v; want pid %d", cred, err, os.Getpid())
	}
}
