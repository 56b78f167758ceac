package forkopts

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/runtime/crun"
)

// Dumped is what a dump asked of CRIU, as plan.json records it: a restore
// of its images must declare the same.
type Dumped struct {
	// TCPEstablished: the dump holds the state of established TCP
	// connections (CRIU's tcp_established), for siblings that keep them.
	TCPEstablished bool `json:"tcp_established"`
	// TCPClose: the dump left established connections alone (CRIU's
	// tcp_close); CRIU then insists on tcp_close at restore too.
	TCPClose  bool `json:"tcp_close,omitempty"`
	FileLocks bool `json:"file_locks"`
	ExtUnixSk bool `json:"ext_unix_sk"`
	ShellJob  bool `json:"shell_job"`
}

// Dump decides the dump's options. Close dumps with tcp_close: the
// source's connections are left alone and no network lock is needed. Keep
// needs tcp_established and the network lock, both costly while the tree
// is held, so they are asked for only when connected says the source's
// network namespace has a connection at all.
func (c Capture) Dump(connected func() (bool, error)) (Dumped, error) {
	d := Dumped{FileLocks: c.FileLocks, ExtUnixSk: c.ExtUnixSk, ShellJob: c.ShellJob}
	if c.TCP.OrClose() == TCPClose {
		d.TCPClose = true
		return d, nil
	}
	has, err := connected()
	if err != nil {
		return d, err
	}
	d.TCPEstablished = has
	return d, nil
}

// SetCriuOpts writes the dump's options into CRIU's RPC options.
func (d Dumped) SetCriuOpts(o *rpc.CriuOpts) {
	o.TcpEstablished = proto.Bool(d.TCPEstablished)
	o.TcpClose = proto.Bool(d.TCPClose)
	o.FileLocks = proto.Bool(d.FileLocks)
	o.ExtUnixSk = proto.Bool(d.ExtUnixSk)
	o.ShellJob = proto.Bool(d.ShellJob)
}

// NeedsNetworkLock tells whether the dump must lock the source's network:
// only a dump that reads connections' state in repair mode does.
func (d Dumped) NeedsNetworkLock() bool { return d.TCPEstablished }

// Restore is how crun must restore these images for a sibling with the
// given TCP policy: the flags that declare what the dump allowed, and
// whether CRIU must close the restored connections (tcp-close, which crun
// has no flag for: see CRIUConfig). A dump with tcp_close must be restored
// with it; one with connection state is closed unless the sibling keeps
// them.
func (d Dumped) Restore(policy TCPPolicy) (args crun.Args, tcpClose bool) {
	keep := policy == TCPKeep
	args.Flag("--tcp-established", d.TCPEstablished && keep)
	args.Flag("--file-locks", d.FileLocks)
	args.Flag("--ext-unix-sk", d.ExtUnixSk)
	args.Flag("--shell-job", d.ShellJob)
	return args, d.TCPClose || (d.TCPEstablished && !keep)
}

// PodmanRestoreFlags are the flags `podman container restore` needs for a
// checkpoint dumped with d, and what it cannot be told (Podman's restore
// has no flag for it).
func (d Dumped) PodmanRestoreFlags() (flags, missing []string) {
	if d.TCPEstablished {
		flags = append(flags, "--tcp-established")
	}
	if d.FileLocks {
		flags = append(flags, "--file-locks")
	}
	if d.ExtUnixSk {
		missing = append(missing, "ext-unix-sk")
	}
	if d.ShellJob {
		missing = append(missing, "shell-job")
	}
	if d.TCPClose {
		missing = append(missing, "tcp-close")
	}
	return flags, missing
}

// CrunArgs renders the capture options as crun's checkpoint and restore
// flags, for an ordinary checkpoint or restore crun does itself. A close
// policy has no crun flag: see CRIUConfig.
func (c Capture) CrunArgs() crun.Args {
	var a crun.Args
	a.Flag("--tcp-established", c.TCP == TCPKeep)
	a.Flag("--ext-unix-sk", c.ExtUnixSk)
	a.Flag("--shell-job", c.ShellJob)
	a.Flag("--file-locks", c.FileLocks)
	return a
}

// CRIU options crun's restore has no flag for, given through CRIUConfig.
const (
	CRIUTCPClose  = "tcp-close"
	CRIULazyPages = "lazy-pages"
	// CRIUActionScript, followed by a path, adds an action script.
	CRIUActionScript = "action-script"
)

// CRIUConfig writes a CRIU configuration file with options into dir and
// returns the environment entry that makes CRIU read it. crun 1.21 has no
// restore flag for tcp-close or lazy-pages, and CRIU reads
// CRIU_CONFIG_FILE in every mode, the RPC one crun uses included.
func CRIUConfig(dir string, options ...string) (string, error) {
	conf := filepath.Join(dir, "tclone-criu.conf")
	if err := os.WriteFile(conf, []byte(strings.Join(options, "\n")+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("writing CRIU's configuration (%s): %w", strings.Join(options, ", "), err)
	}
	return "CRIU_CONFIG_FILE=" + conf, nil
}
