package fork

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
)

// connectedTCPStates are the socket states of /proc/net/tcp (hex, "st")
// that CRIU treats as a connection: dumping one needs tcp_established or
// tcp_close (criu/sk-inet.c, can_dump_inet_sk). LISTEN and CLOSE sockets
// dump as they are; TIME_WAIT and SYN_RECV entries belong to the kernel,
// not to any descriptor of the tree.
var connectedTCPStates = map[string]string{
	"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
	"08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING",
}

// hasConnectedTCP tells whether the network namespace whose /proc/PID/net
// directory is netDir holds a TCP connection, IPv4 or IPv6. It looks at the
// whole namespace, so a connection of a process outside the container that
// shares it counts too: the answer may only err towards "yes".
func hasConnectedTCP(netDir string) (bool, error) {
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(netDir, name))
		if errors.Is(err, os.ErrNotExist) && name == "tcp6" {
			continue // a kernel without IPv6
		}
		if err != nil {
			return false, fmt.Errorf("looking for TCP connections: %w", err)
		}
		found, err := connectedIn(f)
		f.Close()
		if err != nil {
			return false, fmt.Errorf("reading %s: %w", f.Name(), err)
		}
		if found {
			return true, nil
		}
	}
	return false, nil
}

// connectedIn scans one /proc/net/tcp table.
func connectedIn(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		// sl local_address rem_address st ...
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if _, ok := connectedTCPStates[strings.ToUpper(f[3])]; ok {
			return true, nil
		}
	}
	return false, sc.Err()
}

// netNSInode identifies the network namespace process pid runs in.
func netNSInode(pid int) (uint64, error) {
	return inode(fmt.Sprintf("/proc/%d/ns/net", pid))
}

// siblingNetNS says which network namespace a container made from spec
// runs in: the inode of the one it joins (tclone's own when the spec has
// none), or 0 with how it differs when it gets a new one.
func siblingNetNS(spec *specs.Spec) (uint64, string, error) {
	path, ok := namespacePath(spec, specs.NetworkNamespace)
	switch {
	case !ok:
		ino, err := inode("/proc/self/ns/net")
		return ino, "shares the host's network namespace", err
	case path == "":
		return 0, "gets a network namespace of its own", nil
	}
	ino, err := inode(path)
	return ino, "joins network namespace " + path, err
}

// checkKeepTCP refuses to let a sibling keep the source's TCP connections
// anywhere but in the source's own network namespace. CRIU restores a
// connection with TCP_REPAIR exactly as it was: the source's addresses, its
// sequence numbers. From another namespace (another IP) the sibling's
// packets would reach the source's peers as if the source had sent them,
// and both copies would fight over one conversation.
func checkKeepTCP(sourceNetNS uint64, spec *specs.Spec, siblingID string) error {
	ino, where, err := siblingNetNS(spec)
	if err != nil {
		return fmt.Errorf("finding the network namespace of sibling %s: %w", siblingID, err)
	}
	if ino != 0 && ino == sourceNetNS {
		return nil
	}
	return fmt.Errorf("--tcp-established keeps the source's TCP connections in the sibling, which only a sibling in the source's own network namespace may do; sibling %s %s, so its packets would carry the source's address and sequence numbers to the source's peers. Leave --tcp-established out: by default the sibling's copies are closed and the source keeps its connections", siblingID, where)
}

// siblingTCPPolicy decides what a sibling does with its copies of the
// source's connections: what the plan says, or close when the restore asks
// for it. A restore cannot turn a close plan into keep (its images hold no
// connection state), and keep is checked against the sibling's namespace.
func siblingTCPPolicy(p *plan.Plan, req MaterializeRequest, spec *specs.Spec) (forkopts.TCPPolicy, error) {
	if req.TCP == forkopts.TCPClose {
		return forkopts.TCPClose, nil
	}
	policy := p.TCP.OrClose()
	if req.TCP == forkopts.TCPKeep && policy != forkopts.TCPKeep {
		return "", fmt.Errorf("fork plan %s closes the siblings' copies of the source's TCP connections, and holds no connection state for a sibling to keep; restore without --tcp-established, or capture with tclone fork --plan-only --tcp-established for siblings in the source's network namespace", p.ID)
	}
	if policy == forkopts.TCPKeep {
		if err := checkKeepTCP(p.Source.NetNSInode, spec, req.ID); err != nil {
			return "", fmt.Errorf("%w (or restore with --tcp-close)", err)
		}
	}
	return policy, nil
}

// inode is the inode number of path: a namespace's identity, through its
// /proc link or a bind mount of it.
func inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
