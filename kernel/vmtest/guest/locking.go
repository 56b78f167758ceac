package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// asyncDo sends a command to a helper and returns a channel with its answer.
func (p *proc) asyncDo(format string, args ...any) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := p.do(format, args...)
		done <- err
	}()
	return done
}

// readsWithin reports whether reading path completes within d. A read that
// does not is left running; it ends when whatever blocks it goes away.
func readsWithin(path string, d time.Duration) bool {
	d = slow(d)
	done := make(chan struct{})
	go func() {
		os.ReadFile(path)
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// exitsWithin reports whether the child pid has been reaped within d.
func exitsWithin(pid int, d time.Duration) bool {
	deadline := time.Now().Add(slow(d))
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		if got, _ := unix.Wait4(pid, &ws, unix.WNOHANG, nil); got == pid {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// lockPartners is how many processes are paired with the one whose lock is
// held. Which of a pair's two locks a call takes first depends on where the
// kernel allocated the two mm_structs, which userspace cannot see or choose;
// a lock order that blocks on the second lock while holding the first is
// caught when the held process's mm sorts after its partner's, that is, by
// at least one of n partners with probability n/(n+1).
const lockPartners = 4

// testLockHeldElsewhere: a third party holds one process's mmap lock and does
// not let go (a /proc/PID/mem read stuck in a FUSE fault). A cherrypick
// between that process and another must wait for it without locking the
// other process's memory map meanwhile, and must die when killed.
func testLockHeldElsewhere(s *suite) error {
	const size = 2 * mib
	fs, err := startFUSE("/tmp/vcpfuse")
	if err != nil {
		return err
	}
	defer fs.stop()
	b := mustSpawn()
	defer b.release()
	partners := make([]*proc, lockPartners)
	for i := range partners {
		partners[i] = mustSpawn()
		defer partners[i].release()
	}
	addr, fuseAddr := s.region(size), s.region(fuseFileSize)
	if err := mapBoth(addr, size, 0, append([]*proc{b}, partners...)...); err != nil {
		return err
	}
	for _, a := range partners {
		if _, err := a.do("fill %d %d 5 0", addr, size); err != nil {
			return err
		}
		if err := a.stop(); err != nil {
			return err
		}
	}
	if _, err := b.do("map %d %d file r /tmp/vcpfuse/f", fuseAddr, fuseFileSize); err != nil {
		return err
	}
	if err := b.stop(); err != nil {
		return err
	}
	// The reader faults b's FUSE page through b's mm: it holds b's mmap
	// lock until the read is answered.
	var reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		buf := make([]byte, 8)
		b.readMemRaw(fuseAddr, buf)
	}()
	if err := fs.waitRead(10 * time.Second); err != nil {
		return err
	}
	var callers []*proc
	var failed error
	for _, a := range partners {
		caller := mustSpawn()
		callers = append(callers, caller)
		if failed = callerWaitsKillably(caller, a, b, a, addr, size); failed != nil {
			break
		}
	}
	// A caller that failed the test may still wait for the lock; only the
	// release lets it finish, so it is reaped after.
	fs.release()
	reader.Wait()
	for _, c := range callers {
		c.release()
	}
	if failed != nil {
		return failed
	}
	// With the lock free again, the same call works.
	if _, _, err := s.cherrypick(partners[0], b, addr, size); err != nil {
		return fmt.Errorf("after the lock was released: %w", err)
	}
	return expectPattern(b, addr, size, 5, 0)
}

// callerWaitsKillably has a helper call cherrypick(src, dst) while dst's or
// src's lock is held elsewhere, and checks that it waits, that free's memory
// map stays readable meanwhile, and that SIGKILL ends the wait.
func callerWaitsKillably(caller, src, dst, free *proc, addr, size uint64) error {
	answer := caller.asyncDo("cherrypick %d %d %d %d", src.pid, dst.pid, addr, size)
	select {
	case err := <-answer:
		return fmt.Errorf("cherrypick %d -> %d returned (%v) while a lock it needs was held", src.pid, dst.pid, err)
	case <-time.After(500 * time.Millisecond):
	}
	// /proc/PID/cmdline takes the memory map lock for reading.
	if !readsWithin(fmt.Sprintf("/proc/%d/cmdline", free.pid), 3*time.Second) {
		return fmt.Errorf("cherrypick %d -> %d, waiting for a lock held elsewhere, kept helper %d's memory map locked", src.pid, dst.pid, free.pid)
	}
	unix.Kill(caller.pid, unix.SIGKILL)
	if !exitsWithin(caller.pid, 3*time.Second) {
		state, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", caller.pid))
		return fmt.Errorf("cherrypick %d -> %d, waiting for a lock, did not die of SIGKILL (stat: %s)", src.pid, dst.pid, strings.TrimSpace(string(state)))
	}
	caller.alive = false // reaped already
	caller.in.Close()
	caller.outF.Close()
	return nil
}

// readMemRaw reads through a descriptor of its own, so that a read that
// blocks does not hold the helper's shared one.
func (p *proc) readMemRaw(addr uint64, buf []byte) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.pid))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadAt(buf, int64(addr))
	return err
}
