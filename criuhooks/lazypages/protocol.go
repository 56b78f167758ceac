package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// SocketName is the name CRIU connects to, relative to its work directory
// (LAZY_PAGES_SOCK_NAME in criu/uffd.c). The work directory is the images
// directory unless the restore sets another.
const SocketName = "lazy-pages.socket"

// restoreFinished is the word CRIU sends once every task is restored, just
// before it lets them run (LAZY_PAGES_RESTORE_FINISHED). As a pid it would be
// above any pid_max, so it cannot be mistaken for one.
const restoreFinished = 0x52535446

type criuMsgKind int

const (
	msgTask     criuMsgKind = iota // a task and its userfaultfd
	msgZombie                      // a zombie: no memory, no userfaultfd
	msgFinished                    // the restore is complete
)

// criuMsg is one message of a restore's lazy-pages connection.
type criuMsg struct {
	kind criuMsgKind
	// pid is the task's pid in the images (its pid in its own namespace).
	pid int32
	// sender is the host pid of the task that sent the message: each
	// restored task sends its own userfaultfd, from its own process, before
	// it runs the restorer.
	sender int
}

// criuConn reads the messages of one `criu restore --lazy-pages`:
//
//	for each task:  int32 pid, then 1 byte with SCM_RIGHTS {userfaultfd}
//	for a zombie:   int32 -pid
//	at the end:     uint32 0x52535446, then the restore closes the socket
//
// all in host byte order over a stream socket. The daemon turns on
// SO_PASSCRED on its listeners, so each message also names its sender.
type criuConn struct {
	c   *net.UnixConn
	oob []byte
}

func newCriuConn(c *net.UnixConn) (*criuConn, error) {
	// The listener's SO_PASSCRED came with the connection (listenUnix);
	// this covers a connection made some other way.
	if err := setPassCred(c); err != nil {
		return nil, fmt.Errorf("lazy pages: SO_PASSCRED: %w", err)
	}
	return &criuConn{c: c, oob: make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*4))}, nil
}

// next reads the next message's header. For a task, the caller reads its
// userfaultfd with uffd before anything else.
func (cc *criuConn) next() (criuMsg, error) {
	var word [4]byte
	var sender int
	for got := 0; got < len(word); {
		n, creds, fds, err := cc.recv(word[got:])
		closeAll(fds) // no descriptor belongs with a header
		if n == 0 && err == nil {
			err = io.ErrUnexpectedEOF
			if got == 0 {
				err = io.EOF
			}
		}
		if err != nil {
			return criuMsg{}, err
		}
		if got == 0 && creds != nil {
			sender = int(creds.Pid)
		}
		got += n
	}
	v := binary.NativeEndian.Uint32(word[:])
	switch {
	case v == restoreFinished:
		return criuMsg{kind: msgFinished}, nil
	case int32(v) < 0:
		return criuMsg{kind: msgZombie, pid: -int32(v), sender: sender}, nil
	case v == 0:
		return criuMsg{}, errors.New("lazy pages: CRIU sent pid 0")
	}
	return criuMsg{kind: msgTask, pid: int32(v), sender: sender}, nil
}

// uffd reads the descriptor that follows a task's header.
func (cc *criuConn) uffd() (int, error) {
	var dummy [1]byte
	n, _, fds, err := cc.recv(dummy[:])
	if err != nil {
		closeAll(fds)
		return -1, err
	}
	if n != 1 || len(fds) != 1 {
		closeAll(fds)
		return -1, fmt.Errorf("lazy pages: CRIU sent %d bytes and %d descriptors where one userfaultfd belongs", n, len(fds))
	}
	return fds[0], nil
}

func (cc *criuConn) recv(p []byte) (int, *unix.Ucred, []int, error) {
	n, oobn, _, _, err := cc.c.ReadMsgUnix(p, cc.oob)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return n, nil, nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(cc.oob[:oobn])
	if err != nil {
		return n, nil, nil, fmt.Errorf("lazy pages: control message: %w", err)
	}
	var creds *unix.Ucred
	var fds []int
	for i := range msgs {
		if c, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			creds = c
		} else if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, r...)
		}
	}
	return n, creds, fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
