package fork

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/procfs"
)

// External keys crun gives namespaces joined by path. Images dumped by tclone
// are restored by crun, so the keys must be crun's.
const (
	extNetNS = "extRootNetNS"
	extPidNS = "extRootPidNS"
)

// dumpInput is what the CRIU dump options are made from.
type dumpInput struct {
	spec     *specs.Spec
	pid      int
	rootfs   string
	imagesFd int
	workFd   int
	opts     forkopts.Dumped
	// selfCgroups are the caller's cgroups (/proc/self/cgroup).
	selfCgroups []procfs.Cgroup
	unified     bool
	// freezeCgroup is the freezer a paused source is frozen in (source.frozenBy).
	freezeCgroup string
}

// dumpLogLevel is the level of CRIU's log of a capture: warnings and
// errors (2), which say why a capture failed (criuhooks.LogErrors reads
// them), unless tclone itself logs at debug level (--debug, --log-level
// debug). CRIU writes each line of its log while it holds the tree: at
// debug level about 460 lines per process, at info level about 95, each
// a formatted write of its own. Info level cost a 200-process source
// about 0.24 ms of pause per process against warnings only (twin forks,
// six of each alternating: median pause 520 against 472 ms), debug level
// 0.3 ms more.
func dumpLogLevel() int32 {
	if logrus.IsLevelEnabled(logrus.DebugLevel) {
		return 4
	}
	return 2
}

// dumpOptions builds the CRIU options for a leave-running dump that crun's
// restore accepts: the same external mounts and namespaces crun's own
// checkpoint declares, so that `crun restore` can map them onto the sibling.
func dumpOptions(in dumpInput) (*rpc.CriuOpts, error) {
	o := &rpc.CriuOpts{
		ImagesDirFd:       proto.Int32(int32(in.imagesFd)),
		WorkDirFd:         proto.Int32(int32(in.workFd)),
		LogLevel:          proto.Int32(dumpLogLevel()),
		LogFile:           proto.String(dumpLogName),
		Pid:               proto.Int32(int32(in.pid)),
		Root:              proto.String(in.rootfs),
		LeaveRunning:      proto.Bool(true),
		OrphanPtsMaster:   proto.Bool(true),
		ManageCgroups:     proto.Bool(true),
		ManageCgroupsMode: rpc.CriuCgMode_SOFT.Enum(),
		// No FreezeCgroup for a running source: CRIU holds the tree by
		// ptrace alone, which the kernel releases when CRIU dies; a frozen
		// cgroup would outlive it. CRIU's own bound on seizing the tree.
		Timeout: proto.Uint32(10),
	}
	if in.freezeCgroup != "" {
		// A source its caller froze (containerd's CRI checkpoint): CRIU
		// seizes the frozen tree through its freezer and leaves it as it
		// found it, frozen; the caller thaws it, and nothing of tclone's
		// has to (a frozen cgroup that outlives a dead CRIU is the
		// caller's, which it resumes).
		o.FreezeCgroup = proto.String(in.freezeCgroup)
	}
	// A file open under a name that is gone while another hard link
	// remains has no path to record: CRIU links it back under
	// link_remap.N in its directory. The link appears in the frozen
	// window, so the root snapshot (post-dump) carries it to the sibling,
	// whose restore removes it; CRIU removes it from the source before
	// letting the tree go (delete_link_remaps, for leave_running dumps
	// too). A watcher of that directory in the source sees it come and go.
	o.LinkRemap = proto.Bool(true)
	setDumpOpts(o, in.opts)
	if !in.opts.NeedsNetworkLock() {
		// CRIU's network lock drops every packet of the source's network
		// namespace from the seizing of the tree until the dump ends
		// (criu/net.c). It exists for dumps that put connections into
		// TCP_REPAIR to read their state (criu/sk-tcp.c): so that no packet
		// changes the queues and sequence numbers being read, and so that
		// no peer gets a RST from a namespace whose sockets are gone while
		// the copy is made elsewhere.
		//
		// A fork that closes the siblings' copies dumps with tcp_close: CRIU
		// never puts the source's connections into repair mode, records
		// only their addresses, and the source's sockets stay as they are
		// (leave_running), answering their peers the whole time. Nothing
		// needs protecting, and the lock would only cost the source: two
		// iptables runs in the frozen window, and every packet its peers
		// send meanwhile dropped and retransmitted later.
		//
		// Only a dump for siblings that keep the connections (same network
		// namespace, see checkKeepTCP) reads their state, and there the
		// copy depends on that state being consistent: CRIU's default
		// lock stays.
		o.NetworkLock = rpc.CriuNetworkLockMethod_SKIP.Enum()
	}
	if !in.unified && hasMountType(in.spec, "cgroup") {
		for _, dir := range v1CgroupMounts(in.selfCgroups) {
			o.ExtMnt = append(o.ExtMnt, extMount(dir, dir))
		}
	}
	for _, m := range in.spec.Mounts {
		if isBind(m) {
			o.ExtMnt = append(o.ExtMnt, extMount(m.Destination, m.Destination))
		}
	}
	for _, p := range in.spec.Linux.MaskedPaths {
		// Masked files are bind mounts of /dev/null; crun declares the ones
		// that are regular files on the host, and so must we.
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			o.ExtMnt = append(o.ExtMnt, extMount(p, p))
		}
	}
	for _, ns := range in.spec.Linux.Namespaces {
		if ns.Path == "" {
			continue
		}
		var key, kind string
		switch ns.Type {
		case specs.NetworkNamespace:
			key, kind = extNetNS, "net"
		case specs.PIDNamespace:
			key, kind = extPidNS, "pid"
		default:
			continue
		}
		ino, err := inode(ns.Path)
		if err != nil {
			return nil, fmt.Errorf("%s namespace %s: %w", ns.Type, ns.Path, err)
		}
		o.External = append(o.External, fmt.Sprintf("%s[%d]:%s", kind, ino, key))
	}
	return o, nil
}

func extMount(key, val string) *rpc.ExtMountMap {
	return &rpc.ExtMountMap{Key: proto.String(key), Val: proto.String(val)}
}

func isBind(m specs.Mount) bool {
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

func hasMountType(spec *specs.Spec, t string) bool {
	for _, m := range spec.Mounts {
		if m.Type == t {
			return true
		}
	}
	return false
}

// v1CgroupMounts lists the host's v1 hierarchy mount points that a
// container's cgroup mount exposes, normalising controller names the way the
// host mounts them.
func v1CgroupMounts(selfCgroups []procfs.Cgroup) []string {
	var dirs []string
	for _, cg := range selfCgroups {
		if cg.Controllers == "" {
			continue
		}
		sub := strings.TrimPrefix(cg.Controllers, "name=")
		switch sub {
		case "net_prio,net_cls":
			sub = "net_cls,net_prio"
		case "cpuacct,cpu":
			sub = "cpu,cpuacct"
		}
		dirs = append(dirs, filepath.Join(cgroups.Root, sub))
	}
	return dirs
}

// setDumpOpts writes what the dump asks of CRIU into its RPC options.
func setDumpOpts(o *rpc.CriuOpts, d forkopts.Dumped) {
	o.TcpEstablished = proto.Bool(d.TCPEstablished)
	o.TcpClose = proto.Bool(d.TCPClose)
	o.FileLocks = proto.Bool(d.FileLocks)
	o.ExtUnixSk = proto.Bool(d.ExtUnixSk)
	o.ShellJob = proto.Bool(d.ShellJob)
	if d.GhostLimit > 0 {
		o.GhostLimit = proto.Uint32(d.GhostLimit)
	}
}
