package criucheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/internal/flock"
)

// Every CRIU process starts by probing the kernel ("kerndat"): a dozen
// system calls tried, a child traced, iptables and ip6tables run. CRIU keeps
// the answers in /run/criu.kdat, but only where /run is a tmpfs, so that
// they never outlive the boot; it reads the file back without asking where
// it lies. Where /run is on disk (no systemd, as in some VMs), every dump
// and every restore probes again: 25 to 45 ms here, twice a fork, more when
// the host is busy.
//
// There tclone keeps the cache CRIU would: it has CRIU write it in a mount
// namespace of its own whose /run is a tmpfs, and bind-mounts the result
// over /run/criu.kdat. A mount ends with the boot, as a tmpfs would, so the
// answers still never outlive it; CRIU, upgraded, is made to probe again
// (Check does this whenever it checks CRIU anew).

// kerndatFile is where CRIU reads its cache (KDAT_RUNDIR in its build).
const kerndatFile = "/run/criu.kdat"

// kerndatNeeded tells whether CRIU cannot keep its cache by itself.
func kerndatNeeded() bool {
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(kerndatFile), &fs); err != nil {
		return false
	}
	return fs.Type != unix.TMPFS_MAGIC
}

// kerndatMounted tells whether a mount is over target.
func kerndatMounted(target string) bool {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, target, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return false
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// keepKerndat makes CRIU's kernel probe cache available at target where
// CRIU cannot keep it itself. fresh says the CRIU was just checked anew (a
// new boot, or a new binary): a cache mounted before is made again. The
// cache is kept in dir. A failure costs only speed; the caller logs it.
func keepKerndat(ctx context.Context, criu string, env []string, dir, target string, fresh bool) error {
	if kerndatMounted(target) && !fresh {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	unlock, err := flock.Lock(ctx, filepath.Join(dir, "criu.kdat.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if kerndatMounted(target) {
		if !fresh {
			return nil // another tclone made it meanwhile
		}
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting the old CRIU kernel probe cache at %s: %w", target, err)
		}
	}
	data, err := probeKerndat(ctx, criu, env)
	if err != nil {
		return err
	}
	src := filepath.Join(dir, "criu.kdat")
	if err := atomicfile.WriteFile(src, data, 0o600); err != nil {
		return err
	}
	if f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		f.Close()
	} else {
		return fmt.Errorf("making the mount point %s: %w", target, err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mounting CRIU's kernel probe cache at %s: %w", target, err)
	}
	return nil
}

// probeKerndat has CRIU probe the kernel in a mount namespace whose /run
// is a tmpfs, where it writes its cache, and returns the cache.
func probeKerndat(ctx context.Context, criu string, env []string) ([]byte, error) {
	// Go makes the new namespace's mounts private before the shell runs,
	// so nothing mounted there is seen outside.
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c",
		`mount -t tmpfs -o size=1m,mode=0755 tclone-kdat /run && "$0" check >/dev/null 2>&1; exec cat `+kerndatFile, criu)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("having CRIU probe the kernel in a namespace of its own: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if out.Len() == 0 {
		return nil, errors.New("CRIU wrote no kernel probe cache in a namespace whose /run is a tmpfs")
	}
	return out.Bytes(), nil
}
