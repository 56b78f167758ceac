package criuhooks

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// dumpConf is the CRIU configuration file tclone writes for a dump, in its
// work directory.
const dumpConf = "tclone-dump.conf"

// TmpfsBuiltinTar is the option of tclone's build of CRIU (criuhooks/criu,
// tmpfs-builtin-tar.patch) by which CRIU archives the dumped tree's tmpfs
// mounts itself, in the format tar gives them, rather than running tar
// and gzip for each while it holds the tree. Stock CRIU restores the
// images; stock CRIU refuses the option.
const TmpfsBuiltinTar = "tmpfs-builtin-tar"

// SkipConntrack is the option of tclone's build of CRIU
// (skip-conntrack.patch) by which a dump leaves out the network
// namespace's conntrack entries and expectations: two walks of the
// host-wide hash tables (about 9 ms each here) while CRIU holds the tree,
// for entries only a restore of established connections elsewhere uses.
// Its restores find the images empty.
const SkipConntrack = "skip-conntrack"

// SmapsReadAhead is the option of tclone's build of CRIU
// (smaps-read-ahead.patch) by which a dump reads its tasks'
// /proc/PID/smaps, a walk of their page tables (2-3 ms for 100 MiB
// touched), in a thread of its own while it dumps the tasks before, and
// uses what it read only where the task's mappings have not changed
// since.
const SmapsReadAhead = "smaps-read-ahead"

// BusyWait is the option of tclone's build of CRIU (busy-wait.patch) by
// which a dump polls, for up to the microseconds it is given, for a task's
// stop after each call it injects and for its parasite's reply to each
// command, before it sleeps: a task answers within microseconds, and on a
// virtual machine the wake-up of the sleeping dump costs each of these
// round trips about as much again, some 25 times a task while the tree is
// held. Only CRIU polls; the tasks wait as before.
const BusyWait = "busy-wait"

// BusyWaitMicros is the budget tclone gives BusyWait: a 200-process tree
// was held 386-399 ms with it against 485 ms without (median of five
// dumps each); 50 and 500 µs did no better.
const BusyWaitMicros = 200

// Configure gives the dump of opts the CRIU options in lines (long options
// without their dashes, one per line, as CRIU's configuration files take
// them): some options have no RPC field, and those of tclone's build of
// CRIU have none in go-criu's messages. The file is written into workDir;
// call the returned function once the dump has returned.
func Configure(opts *rpc.CriuOpts, workDir string, lines []string) (func(), error) {
	if opts.ConfigFile != nil {
		return nil, fmt.Errorf("the dump already has a CRIU configuration file (%s)", opts.GetConfigFile())
	}
	path := filepath.Join(workDir, dumpConf)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("CRIU configuration file: %w", err)
	}
	opts.ConfigFile = proto.String(path)
	return func() { os.Remove(path) }, nil
}
