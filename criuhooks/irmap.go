package criuhooks

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fh"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"
)

// IrmapEntry names the file behind an inode: Dev in the kernel's encoding
// (major<<20 | minor, as /proc/PID/fdinfo prints sdev), Path absolute in the
// dumped tree's root.
type IrmapEntry struct {
	Dev   uint32
	Inode uint64
	Path  string
}

// IrmapCacheFile is the name CRIU's dump looks for in its work directory
// (a service image: no .img suffix, like stats-dump).
const IrmapCacheFile = "irmap-cache"

// WriteIrmapCache leaves CRIU an irmap cache in workDir. A dump that needs
// the path of a watched inode it cannot reopen by handle (overlayfs without
// nfs_export) looks there first, checks the entry with one stat, and only
// otherwise scans its few hint directories, which miss nearly every file a
// workspace watches. CRIU writes this image itself at pre-dump; tclone
// fills it before the freeze instead.
func WriteIrmapCache(workDir string, entries []IrmapEntry) error {
	m := magic.LoadMagic()
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint32(m.ByName["IMG_SERVICE"]))
	binary.Write(&b, binary.LittleEndian, uint32(m.ByName["IRMAP_CACHE"]))
	for _, e := range entries {
		data, err := proto.Marshal(&fh.IrmapCacheEntry{Dev: proto.Uint32(e.Dev), Inode: proto.Uint64(e.Inode), Path: proto.String(e.Path)})
		if err != nil {
			return fmt.Errorf("encoding the irmap entry of %s: %w", e.Path, err)
		}
		binary.Write(&b, binary.LittleEndian, uint32(len(data)))
		b.Write(data)
	}
	return os.WriteFile(filepath.Join(workDir, IrmapCacheFile), b.Bytes(), 0o600)
}
