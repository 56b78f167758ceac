package crun

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Capture is the capture options crun's checkpoint and restore have flags
// for: what a dump allowed, which its restore must declare.
type Capture struct {
	TCPEstablished bool
	FileLocks      bool
	ExtUnixSk      bool
	ShellJob       bool
}

// Args renders the options as crun's flags.
func (c Capture) Args() Args {
	var a Args
	a.Flag("--tcp-established", c.TCPEstablished)
	a.Flag("--ext-unix-sk", c.ExtUnixSk)
	a.Flag("--shell-job", c.ShellJob)
	a.Flag("--file-locks", c.FileLocks)
	return a
}

// Restore is a crun restore of a checkpoint into a container.
type Restore struct {
	ID                string
	ImagePath         string
	WorkPath          string
	Bundle            string
	Detach            bool
	PidFile           string
	ConsoleSocket     string
	Capture           Capture
	ManageCgroupsMode string
	LSMProfile        string
	LSMMountContext   string
}

// Args renders the restore as crun's restore arguments, the container's
// ID last.
func (r Restore) Args() Args {
	a := Args{}
	a.Value("--image-path", r.ImagePath)
	a.Value("--work-path", r.WorkPath)
	a.Value("--bundle", r.Bundle)
	a.Flag("--detach", r.Detach)
	a.Value("--pid-file", r.PidFile)
	a.Value("--console-socket", r.ConsoleSocket)
	a = append(a, r.Capture.Args()...)
	a.Value("--manage-cgroups-mode", r.ManageCgroupsMode)
	a.Value("--lsm-profile", r.LSMProfile)
	a.Value("--lsm-mount-context", r.LSMMountContext)
	return append(a, r.ID)
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
