package criuhooks

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"google.golang.org/protobuf/proto"
)

// TCP states of the kernel's that a socket in the images may hold and
// still be no connection: listening, or closed.
const (
	tcpListen  = 10
	tcpClose   = 7
	ipprotoTCP = 6
)

// ClearTCPClose makes the CRIU images in dir restorable without CRIU's
// tcp-close option, which restores that cannot pass CRIU options (Podman's,
// through crun) cannot ask for. A dump taken with tcp-close records it in
// its inventory, and CRIU then refuses every restore without it, though the
// option only says how to restore established TCP connections (closed).
// So the record is cleared where the images hold no TCP socket but
// listening and closed ones; it is kept, and their number returned,
// where they hold connections.
func ClearTCPClose(dir string) (connections int, err error) {
	files, err := decodeImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	if files != nil {
		for _, e := range files.Entries {
			f, ok := e.Message.(*fdinfo.FileEntry)
			if !ok {
				continue
			}
			if sk := f.GetIsk(); sk != nil && sk.GetProto() == ipprotoTCP && sk.GetState() != tcpListen && sk.GetState() != tcpClose {
				connections++
			}
		}
	}
	if connections > 0 {
		return connections, nil
	}
	return 0, rewriteImage(filepath.Join(dir, "inventory.img"), &inventory.InventoryEntry{}, func(m proto.Message) bool {
		inv := m.(*inventory.InventoryEntry)
		if !inv.GetTcpClose() {
			return false
		}
		inv.TcpClose = nil
		return true
	})
}
