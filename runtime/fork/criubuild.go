package fork

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/forkopts"
)

// tclone's build of CRIU (hack/build-criu.sh, criuhooks/criu): the host's
// CRIU version with tclone's patches, and the twin plugin built against it.
// Only dumps run it; restores run the host's CRIU, which reads its images.

// EnvCriuDir overrides where tclone's build of CRIU and its plugin are
// (hack/build-criu.sh installs them).
const EnvCriuDir = "TCLONE_CRIU_DIR"

// DefaultCriuDir is where hack/build-criu.sh installs tclone's CRIU.
const DefaultCriuDir = "/usr/local/lib/tclone/criu"

func criuDir() string {
	if d := os.Getenv(EnvCriuDir); d != "" {
		return d
	}
	return DefaultCriuDir
}

// criuBuild is tclone's build of CRIU as installed.
type criuBuild struct {
	// Path is its criu, "" where none is installed for this host's CRIU
	// version.
	Path string
	// Options are the options its patches add. Every build has
	// lazy-pages-external; a build's stamp lists them on its third line
	// since there was more than one.
	Options []string
	// KerndatDir is where it keeps its kernel probe cache (criuStamp).
	KerndatDir string
}

// criuStamp is what hack/build-criu.sh's stamp in a build directory says:
// the CRIU version the build and the plugin are for (the first field of
// its first line) and where it caches its kernel probe (a RUNDIR= field
// there), the plugin's sources' hash (its second line) and, on its third
// line ("options ..."), the options the build has; a stamp older than that
// line has lazy-pages-external alone.
type criuStamp struct {
	Version string
	// KerndatDir is the directory the build keeps its kernel probe
	// cache in (its RUNDIR), "" for a build that shares the host's.
	KerndatDir string
	// Plugin is the twin plugin's stamp (its second line): the hash of
	// the sources it was built from (criuhooks.TwinPluginStamp).
	Plugin  string
	Options []string
}

func readCRIUStamp(dir string) criuStamp {
	stamp, _ := os.ReadFile(filepath.Join(dir, ".stamp"))
	lines := strings.Split(string(stamp), "\n")
	var st criuStamp
	f := strings.Fields(lines[0])
	if len(f) > 0 {
		st.Version = f[0]
	}
	for _, field := range f {
		if dir, ok := strings.CutPrefix(field, "RUNDIR="); ok && filepath.IsAbs(dir) {
			st.KerndatDir = dir
		}
	}
	if len(lines) > 1 {
		st.Plugin = strings.TrimSpace(lines[1])
	}
	st.Options = []string{"lazy-pages-external"}
	if len(lines) > 2 {
		if f := strings.Fields(lines[2]); len(f) > 1 && f[0] == "options" {
			st.Options = f[1:]
		}
	}
	return st
}

// installedBuild reads tclone's build of CRIU in criuDir(), if it is there
// and built from this CRIU version.
func installedBuild(check *criucheck.Result) criuBuild {
	dir := criuDir()
	st := readCRIUStamp(dir)
	if st.Version != check.Version.String() {
		return criuBuild{}
	}
	if _, err := os.Stat(filepath.Join(dir, "criu")); err != nil {
		return criuBuild{}
	}
	return criuBuild{Path: filepath.Join(dir, "criu"), Options: st.Options, KerndatDir: st.KerndatDir}
}

// keepKerndat makes the directory the build keeps its kernel probe cache
// in, so that its next dumps skip the probe (20-30 ms before each dump,
// before the tree is seized). Without it the build probes every time.
func (b criuBuild) keepKerndat() {
	if b.Path == "" || b.KerndatDir == "" {
		return
	}
	if err := os.MkdirAll(b.KerndatDir, 0o700); err != nil {
		logrus.Debugf("tclone's CRIU probes the kernel in each dump: %v", err)
	}
}

// externalCRIU is tclone's build of CRIU, with lazy-pages-external, where
// it is installed for this CRIU version, or "".
func externalCRIU(check *criucheck.Result) string {
	return installedBuild(check).Path
}

// dumpConf is what a dump d by tclone's build of CRIU is configured with,
// where the build can: its tmpfs mounts archived by CRIU itself, not by
// tar in the source's pause, its tasks' smaps read ahead of their dumps,
// its waits for the tasks polled before they sleep, and, unless it keeps
// established TCP connections (whose restores may need the entries), no
// conntrack entries.
func (b criuBuild) dumpConf(d forkopts.Dumped) []string {
	if b.Path == "" {
		return nil
	}
	var conf []string
	if slices.Contains(b.Options, criuhooks.TmpfsBuiltinTar) {
		conf = append(conf, criuhooks.TmpfsBuiltinTar)
	}
	if !d.TCPEstablished && slices.Contains(b.Options, criuhooks.SkipConntrack) {
		conf = append(conf, criuhooks.SkipConntrack)
	}
	if slices.Contains(b.Options, criuhooks.SmapsReadAhead) {
		conf = append(conf, criuhooks.SmapsReadAhead)
	}
	if slices.Contains(b.Options, criuhooks.BusyWait) {
		conf = append(conf, fmt.Sprintf("%s %d", criuhooks.BusyWait, criuhooks.BusyWaitMicros))
	}
	return conf
}
