// Package criucheck decides, before any checkpoint, restore or fork, whether
// the CRIU on this host can do the job on this kernel. A dump that cannot
// succeed must be refused up front: once CRIU has seized a container, a failure
// halfway costs the user a frozen or disturbed workload.
package criucheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/procfs"
)

// EnvBinary overrides which criu binary tclone uses.
const EnvBinary = "TCLONE_CRIU"

// Version is a CRIU version as CRIU's RPC encodes it: major*10000 +
// minor*100 + sublevel (4.2.1 = 40201).
type Version int

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", int(v)/10000, int(v)/100%100, int(v)%100)
}

// Requirement is a minimum CRIU version and why it is needed.
type Requirement struct {
	Min    Version
	Reason string
}

// Kernel is a kernel release as major/minor.
type Kernel struct{ Major, Minor int }

func (k Kernel) atLeast(major, minor int) bool {
	return k.Major > major || (k.Major == major && k.Minor >= minor)
}

// Required returns the oldest CRIU that works on kernel k.
func Required(k Kernel) Requirement {
	if k.atLeast(6, 16) {
		// Kernels >= 6.16 reject a socket option CRIU < 4.2 reads from every
		// inet socket ("Can't get 1:16 opt: Operation not supported"), so any
		// container with a TCP listener fails to dump.
		return Requirement{Min: 40200, Reason: "kernels >= 6.16 need CRIU >= 4.2 to dump inet sockets (CRIU issue #2705)"}
	}
	// crun's libcriu wrapper refuses anything older.
	return Requirement{Min: 31500, Reason: "crun needs CRIU >= 3.15"}
}

// NeedsNoBreakpointsWorkaround reports whether CRIU v must be told not to use
// hardware breakpoints. CRIU < 4.2 does not notice when they never fire (as in
// many VMs) and then waits forever with the container seized; the fault
// injection switch 130 makes it use the slower but safe path everywhere.
func NeedsNoBreakpointsWorkaround(v Version) bool { return v < 40200 }

// Env returns the environment additions every CRIU process tclone starts
// (directly or through crun) must carry.
func (r *Result) Env() []string {
	if NeedsNoBreakpointsWorkaround(r.Version) {
		return []string{"CRIU_FAULT=130"}
	}
	return nil
}

// Result is a successful check.
type Result struct {
	Path    string  `json:"path"`
	Version Version `json:"version"`
	Kernel  string  `json:"kernel"`
	// LazyPages is set when CRIU and the kernel can restore memory lazily
	// (userfaultfd with the non-cooperative events); NoLazyPages says why
	// not.
	LazyPages   bool   `json:"lazy_pages"`
	NoLazyPages string `json:"no_lazy_pages,omitempty"`
	// NoKerndatCache says why CRIU's kernel probe cache could not be kept
	// where /run is not a tmpfs (see keepKerndat); it is not tried again
	// until CRIU is checked anew.
	NoKerndatCache string `json:"no_kerndat_cache,omitempty"`
}

// Error is a failed check. It always says what to do.
type Error struct {
	What string
	Fix  string
}

func (e *Error) Error() string { return e.What + "; " + e.Fix }

const fixInstall = "install CRIU >= 4.2 (hack/setup-host.sh does: it takes criu from Debian testing on bookworm/trixie hosts) or point $" + EnvBinary + " at a newer criu"

// Find locates the criu binary.
func Find() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("criu"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/criu", "/usr/local/sbin/criu", "/usr/bin/criu"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", &Error{What: "criu not found", Fix: fixInstall}
}

// versionOf reads CRIU's answer to a version request. A build from git
// (one with a GitID) counts as the release it names.
func versionOf(v *rpc.CriuVersion) Version {
	return Version(v.GetMajorNumber()*10000 + v.GetMinorNumber()*100 + v.GetSublevel())
}

var kernelRE = regexp.MustCompile(`^(\d+)\.(\d+)`)

// ParseKernel reads a kernel release string such as "6.18.44-fc".
func ParseKernel(release string) (Kernel, error) {
	m := kernelRE.FindStringSubmatch(release)
	if m == nil {
		return Kernel{}, fmt.Errorf("unrecognised kernel release %q", release)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return Kernel{major, minor}, nil
}

func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

type cacheKey struct {
	// Format changes when Result gains a field, so that an older cache
	// is checked again.
	Format int    `json:"format"`
	BootID string `json:"boot_id"`
	Kernel string `json:"kernel"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	MTime  int64  `json:"mtime_ns"`
}

// cacheFormat is the version of the cached Result.
const cacheFormat = 3

type cacheEntry struct {
	Key    cacheKey `json:"key"`
	Result Result   `json:"result"`
}

func currentKey(path, kernel string) (cacheKey, error) {
	boot, err := procfs.BootID()
	if err != nil {
		return cacheKey{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return cacheKey{}, err
	}
	return cacheKey{Format: cacheFormat, BootID: boot, Kernel: kernel, Path: path, Size: st.Size(), MTime: st.ModTime().UnixNano()}, nil
}

// Check verifies the CRIU tclone will use. A success is kept in cacheFile
// (none if empty), so that each fork does not pay for `criu check` again:
// it is cheap after the first success on a boot. The cache is keyed by
// boot, kernel and the criu binary's identity, so an upgrade or a reboot
// invalidates it.
func Check(ctx context.Context, cacheFile string) (*Result, error) {
	path, err := Find()
	if err != nil {
		return nil, err
	}
	release, err := kernelRelease()
	if err != nil {
		return nil, fmt.Errorf("reading kernel release: %w", err)
	}
	key, keyErr := currentKey(path, release)
	useCache := keyErr == nil && cacheFile != ""
	if useCache {
		if r, ok := readCache(cacheFile, key); ok {
			// Made when CRIU was checked; only an unmount undoes it.
			if kerndatFailed(ctx, r, filepath.Dir(cacheFile), false) {
				writeCache(cacheFile, cacheEntry{Key: key, Result: *r})
			}
			return r, nil
		}
	}
	r, err := check(ctx, path, release)
	if err != nil {
		return nil, err
	}
	if useCache {
		kerndatFailed(ctx, r, filepath.Dir(cacheFile), true)
		writeCache(cacheFile, cacheEntry{Key: key, Result: *r})
	}
	return r, nil
}

// kerndatFailed keeps CRIU's kernel probe cache where /run is not a tmpfs
// (keepKerndat, in dir), unless that failed before for this CRIU. A new
// failure is logged and recorded in r, so that it is not tried again on
// every call; kerndatFailed reports it.
func kerndatFailed(ctx context.Context, r *Result, dir string, fresh bool) bool {
	if r.NoKerndatCache != "" || !kerndatNeeded() {
		return false
	}
	err := keepKerndat(ctx, r.Path, r.Env(), dir, kerndatFile, fresh)
	if err == nil {
		return false
	}
	logrus.Warnf("CRIU probes the kernel anew in every dump and restore, which slows each fork by tens of milliseconds: /run is not a tmpfs, and keeping CRIU's cache failed: %v (forks still work; a tmpfs on /run, as systemd mounts it, makes CRIU keep the cache itself)", err)
	r.NoKerndatCache = err.Error()
	return true
}

func check(ctx context.Context, path, release string) (*Result, error) {
	kernel, err := ParseKernel(release)
	if err != nil {
		return nil, err
	}
	ver, err := criuhooks.Version(ctx, path, nil)
	if err != nil {
		return nil, &Error{
			What: fmt.Sprintf("asking %s for its version failed: %v", path, err),
			Fix:  "repair the criu installation (a missing shared library usually means `ldconfig` or a reinstall); " + fixInstall,
		}
	}
	v := versionOf(ver)
	req := Required(kernel)
	if v < req.Min {
		return nil, &Error{
			What: fmt.Sprintf("criu %s at %s is too old for kernel %s: %s", v, path, release, req.Reason),
			Fix:  fixInstall,
		}
	}
	res := &Result{Path: path, Version: v, Kernel: release}
	// The kernel check stays a command: go-criu has no call for CRIU's
	// check request, and over RPC CRIU answers with the first error of a
	// failed check only, where the command prints each one (lastErrors
	// keeps the last few).
	cmd := exec.CommandContext(ctx, path, "check")
	cmd.Env = append(os.Environ(), res.Env()...)
	var combined bytes.Buffer
	cmd.Stdout, cmd.Stderr = &combined, &combined
	if err := cmd.Run(); err != nil {
		return nil, &Error{
			What: fmt.Sprintf("`criu check` (criu %s, kernel %s) failed: %s", v, release, lastErrors(combined.String())),
			Fix:  "this kernel lacks something CRIU needs; run `criu check` for the full report, then " + fixInstall,
		}
	}
	res.LazyPages, res.NoLazyPages = checkLazyPages(ctx, path, res.Env())
	return res, nil
}

// checkLazyPages asks CRIU whether lazy restores work here: they need
// userfaultfd with the fork, remap and unmap events. CRIU's lazy-pages
// feature is what `criu check --feature uffd-noncoop` checks.
func checkLazyPages(ctx context.Context, path string, env []string) (bool, string) {
	got, err := criuhooks.Features(ctx, path, env, &rpc.CriuFeatures{LazyPages: proto.Bool(true)})
	if err != nil {
		return false, fmt.Sprintf("CRIU's lazy-pages feature check (uffd-noncoop) failed: %v", err)
	}
	if !got.GetLazyPages() {
		return false, "CRIU's lazy-pages feature check (uffd-noncoop) says this kernel lacks userfaultfd or its non-cooperative events (fork, remap and unmap: CONFIG_USERFAULTFD, Linux 4.11 or later)"
	}
	return true, ""
}

// lastErrors keeps the lines of CRIU output that explain a failure.
func lastErrors(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Error") || strings.Contains(line, "FAIL") {
			keep = append(keep, strings.TrimSpace(line))
		}
	}
	if len(keep) == 0 {
		return strings.TrimSpace(out)
	}
	if len(keep) > 5 {
		keep = keep[len(keep)-5:]
	}
	return strings.Join(keep, " | ")
}

func readCache(path string, key cacheKey) (*Result, bool) {
	var e cacheEntry
	if atomicfile.ReadJSON(path, &e) != nil || e.Key != key {
		return nil, false
	}
	return &e.Result, true
}

func writeCache(path string, e cacheEntry) {
	if os.MkdirAll(filepath.Dir(path), 0o700) == nil {
		atomicfile.WriteJSON(path, e, 0o600)
	}
}
