// Package netlock undoes what a CRIU dump changes in a running container's
// network when CRIU dies before it can undo it itself.
//
// While CRIU 4.2 dumps a tree that has its own network namespace, it may lock
// that namespace (network_lock in criu/net.c): an iptables chain named CRIU
// jumped to from INPUT and OUTPUT, or an nftables table "inet CRIU-<run id>",
// both dropping every packet but CRIU's own (mark 0xC114). And when it dumps
// established TCP connections it puts their sockets into TCP repair mode,
// where they send nothing. CRIU removes both before it lets the tree go; a
// CRIU killed in between leaves them, and the container, although running,
// is cut off the network. The kernel undoes nothing of it.
package netlock

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Namespace is a network namespace by path, and the inode the path led to
// when it was recorded.
type Namespace struct {
	Path  string
	Inode uint64
}

// Identify records the namespace path leads to now.
func Identify(path string) (Namespace, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Namespace{}, fmt.Errorf("network namespace %s: %w", path, err)
	}
	return Namespace{Path: path, Inode: st.Ino}, nil
}

// RemoveLock deletes CRIU's network lock from ns, and reports whether it
// found one. A namespace that is gone, or whose path now leads to another
// namespace, has nothing of the capture's to unlock.
func RemoveLock(ns Namespace) (bool, error) {
	found := false
	err := inNamespace(ns, func() error {
		var errs []error
		for _, tool := range []string{"iptables", "ip6tables"} {
			f, err := removeIptablesLock(tool)
			found = found || f
			errs = append(errs, err)
		}
		f, err := removeNftablesLocks()
		found = found || f
		return errors.Join(append(errs, err)...)
	})
	if err != nil {
		return found, fmt.Errorf("removing CRIU's network lock from %s: %w", ns.Path, err)
	}
	return found, nil
}

// inNamespace runs fn on a thread that has joined ns, so that the commands
// fn starts run there too. The thread is never given back to the Go
// runtime: it ends with its goroutine, and its namespace with it.
func inNamespace(ns Namespace, fn func() error) error {
	f, err := os.Open(ns.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if ns.Inode != 0 && st.Ino != ns.Inode {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("joining network namespace %s: %w", ns.Path, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// removeIptablesLock removes the CRIU chain and its jumps, as CRIU's own
// iptables_network_unlock_internal does. A missing tool means CRIU could
// not have used it either.
func removeIptablesLock(tool string) (bool, error) {
	path, err := exec.LookPath(tool)
	if err != nil {
		return false, nil
	}
	found := false
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		// A jump inserted twice (two CRIU runs that both died) needs two
		// deletions; the bound only guards against a tool that lies.
		for i := 0; i < 16 && quiet(path, "-w", "-C", chain, "-j", "CRIU") == nil; i++ {
			found = true
			if err := quiet(path, "-w", "-D", chain, "-j", "CRIU"); err != nil {
				return found, fmt.Errorf("%s -D %s -j CRIU: %w", tool, chain, err)
			}
		}
	}
	if quiet(path, "-w", "-n", "-L", "CRIU") != nil {
		return found, nil
	}
	for _, args := range [][]string{{"-w", "-F", "CRIU"}, {"-w", "-X", "CRIU"}} {
		if err := quiet(path, args...); err != nil {
			return true, fmt.Errorf("%s %s: %w", tool, strings.Join(args, " "), err)
		}
	}
	return true, nil
}

// removeNftablesLocks deletes the tables CRIU's nftables lock makes.
func removeNftablesLocks() (bool, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return false, nil
	}
	out, err := exec.Command(path, "list", "tables").Output()
	if err != nil {
		return false, fmt.Errorf("nft list tables: %w", err)
	}
	found := false
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" || f[1] != "inet" || !strings.HasPrefix(f[2], "CRIU-") {
			continue
		}
		found = true
		if err := quiet(path, "delete", "table", "inet", f[2]); err != nil {
			return found, fmt.Errorf("nft delete table inet %s: %w", f[2], err)
		}
	}
	return found, nil
}

// quiet runs a command and returns its error with its stderr.
func quiet(path string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("%w: %s", err, msg)
		}
		return err
	}
	return nil
}

// EndTCPRepair turns repair mode off on every TCP socket of the given
// processes that is in it, as CRIU does when it lets a tree go, and reports
// how many it found. Only a dump in progress puts a running container's
// sockets into repair mode, so any found in it were left by a dead CRIU.
func EndTCPRepair(pids []int) (int, error) {
	seen := map[string]bool{}
	n := 0
	var errs []error
	for _, pid := range pids {
		k, err := endTCPRepairOf(pid, seen)
		n += k
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

func endTCPRepairOf(pid int, seen map[string]bool) (int, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, nil // gone: its sockets are closed or held by another
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, nil
	}
	n := 0
	var errs []error
	for _, e := range entries {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") || seen[link] {
			continue
		}
		num, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if err != nil {
			continue // closed meanwhile
		}
		seen[link] = true
		on, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR)
		if err == nil && on != 0 {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0); err != nil {
				errs = append(errs, fmt.Errorf("turning TCP repair mode off on %s of process %d: %w", link, pid, err))
			} else {
				n++
			}
		}
		unix.Close(fd)
	}
	return n, errors.Join(errs...)
}
