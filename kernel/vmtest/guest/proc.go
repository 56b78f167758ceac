package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// proc is a helper process as the suite sees it.
type proc struct {
	pid   int
	pidfd int
	in    *os.File
	out   *bufio.Reader
	outF  *os.File
	mem   *os.File
	alive bool
	// stopped: the suite stopped it (SIGSTOP) and has not continued it.
	stopped bool
}

// spawn starts a helper; uid/gid 0 keep root. No parent-death signal: it
// follows the forking OS thread, and the suite discards threads (see
// onThreadWithout), which would kill helpers at random.
func spawn(uid, gid uint32) (*proc, error) { return spawnWith(uid, gid, nil) }

// spawnWith is spawn with further process attributes (namespaces, say).
func spawnWith(uid, gid uint32, sys func(*syscall.SysProcAttr)) (*proc, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Files: []uintptr{inR.Fd(), outW.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{},
	}
	if uid != 0 || gid != 0 {
		attr.Sys.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	if sys != nil {
		sys(attr.Sys)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pid, err := syscall.ForkExec(self, []string{"vcptest", "helper"}, attr)
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start helper: %w", err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return &proc{pid: pid, pidfd: pidfd, in: inW, out: bufio.NewReader(outR), outF: outR, alive: true}, nil
}

func mustSpawn() *proc {
	p, err := spawn(0, 0)
	if err != nil {
		fatalf("%v", err)
	}
	return p
}

// do sends one command and returns the helper's answer.
func (p *proc) do(format string, args ...any) (string, error) {
	line := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		return "", fmt.Errorf("helper %d: send %q: %w", p.pid, line, err)
	}
	reply, err := p.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("helper %d: no answer to %q: %w", p.pid, line, err)
	}
	reply = strings.TrimSpace(reply)
	if rest, ok := strings.CutPrefix(reply, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("helper %d: %q: %s", p.pid, line, strings.TrimPrefix(reply, "err "))
}

func (p *proc) doUint(format string, args ...any) (uint64, error) {
	s, err := p.do(format, args...)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// stop sends SIGSTOP and waits until every thread has stopped; a helper the
// suite already stopped is left as it is.
func (p *proc) stop() error {
	if p.stopped {
		return nil
	}
	if err := unix.Kill(p.pid, unix.SIGSTOP); err != nil {
		return err
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(p.pid, &ws, unix.WUNTRACED, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for helper %d to stop: %w", p.pid, err)
		}
		if ws.Stopped() {
			p.stopped = true
			return nil
		}
		return fmt.Errorf("helper %d did not stop: %v", p.pid, ws)
	}
}

func (p *proc) cont() error {
	if err := unix.Kill(p.pid, unix.SIGCONT); err != nil {
		return err
	}
	p.stopped = false
	return nil
}

// kill ends the helper and reaps it; its pidfd stays open until release.
func (p *proc) kill() {
	if !p.alive {
		return
	}
	p.alive = false
	unix.Kill(p.pid, unix.SIGKILL)
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(p.pid, &ws, 0, nil); err != unix.EINTR {
			break
		}
	}
	p.in.Close()
	p.outF.Close()
	if p.mem != nil {
		p.mem.Close()
		p.mem = nil
	}
}

func (p *proc) release() {
	p.kill()
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// readMem reads the helper's memory through /proc/PID/mem. Unlike
// process_vm_readv, which pins pages and so makes the kernel unshare
// (copy) every shared anonymous page it reads, this takes plain references
// and leaves the sharing the suite is measuring intact.
func (p *proc) readMem(addr uint64, buf []byte) error {
	if p.mem == nil {
		f, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.pid))
		if err != nil {
			return err
		}
		p.mem = f
	}
	n, err := p.mem.ReadAt(buf, int64(addr))
	if err != nil || n != len(buf) {
		return fmt.Errorf("read helper %d memory %#x+%#x: %d bytes, %v", p.pid, addr, len(buf), n, err)
	}
	return nil
}

// area is one VMA's entry in /proc/PID/smaps, sizes in KiB.
type area struct {
	start, end    uint64
	name          string
	rss, pss      uint64
	anonymous     uint64
	anonHuge      uint64
	flags         []string
	sharedDirty   uint64
	privateDirty  uint64
	sharedClean   uint64
	privateClean  uint64
	swap, swapPss uint64
}

func (a area) hasFlag(f string) bool {
	for _, x := range a.flags {
		if x == f {
			return true
		}
	}
	return false
}

func smaps(pid int) ([]area, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	var areas []area
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		f := strings.Fields(string(line))
		if len(f) == 0 {
			continue
		}
		if r := strings.SplitN(f[0], "-", 2); len(r) == 2 && !strings.HasSuffix(f[0], ":") {
			s, err1 := strconv.ParseUint(r[0], 16, 64)
			e, err2 := strconv.ParseUint(r[1], 16, 64)
			if err1 == nil && err2 == nil {
				a := area{start: s, end: e}
				if len(f) >= 6 {
					a.name = f[5]
				}
				areas = append(areas, a)
				continue
			}
		}
		if len(areas) == 0 {
			continue
		}
		a := &areas[len(areas)-1]
		if f[0] == "VmFlags:" {
			a.flags = f[1:]
			continue
		}
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			a.rss = v
		case "Pss:":
			a.pss = v
		case "Anonymous:":
			a.anonymous = v
		case "AnonHugePages:":
			a.anonHuge = v
		case "Shared_Dirty:":
			a.sharedDirty = v
		case "Private_Dirty:":
			a.privateDirty = v
		case "Shared_Clean:":
			a.sharedClean = v
		case "Private_Clean:":
			a.privateClean = v
		case "Swap:":
			a.swap = v
		case "SwapPss:":
			a.swapPss = v
		}
	}
	return areas, nil
}

// areaAt returns the VMA starting at addr.
func (p *proc) areaAt(addr uint64) (area, error) {
	areas, err := smaps(p.pid)
	if err != nil {
		return area{}, err
	}
	for _, a := range areas {
		if a.start == addr {
			return a, nil
		}
	}
	return area{}, fmt.Errorf("helper %d has no area at %#x", p.pid, addr)
}

func (p *proc) areaNamed(name string) (area, bool, error) {
	areas, err := smaps(p.pid)
	if err != nil {
		return area{}, false, err
	}
	for _, a := range areas {
		if a.name == name {
			return a, true, nil
		}
	}
	return area{}, false, nil
}

func meminfo(key string) (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == key+":" {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/meminfo", key)
}
