package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"github.com/tclone/tclone/kernel/cherrypick"
	"golang.org/x/sys/unix"
)

const (
	capSysPtrace         = 19
	capSysAdmin          = 21
	capCheckpointRestore = 40
)

// onThreadWithout runs fn on an OS thread that has dropped the given
// capabilities. Capabilities are per thread; the thread is discarded after
// (the goroutine exits while locked), so the rest of the suite keeps root.
func onThreadWithout(caps []int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capget: %w", err)
			return
		}
		for _, c := range caps {
			mask := ^uint32(1 << (c % 32))
			data[c/32].Effective &= mask
			data[c/32].Permitted &= mask
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capset: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// rawArgs mirrors struct vcp_cherrypick, to send what the bindings never do.
type rawArgs struct {
	src, dst                    int32
	start, length, flags        uint64
	areas, anonPages, swapPages uint64
}

func rawCherrypick(args *rawArgs) error {
	f, err := os.OpenFile(cherrypick.DevicePath, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const req = 3<<30 | 56<<16 | 0xE4<<8 | 1 // _IOWR(0xE4, 1, 56)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(unsafe.Pointer(args)))
	if errno != 0 {
		return errno
	}
	return nil
}

type refusal struct {
	what string
	want error
	run  func() error
}

func testRefusals(s *suite) error {
	const size = 4 * mib
	src, dst := mustSpawn(), mustSpawn()
	defer src.release()
	defer dst.release()
	nobody, err := spawn(65534, 65534)
	if err != nil {
		return err
	}
	defer nobody.release()
	gone := mustSpawn()
	gone.kill() // exited and reaped; its pidfd stays open
	defer gone.release()

	// One area of each kind, laid out in both helpers unless noted.
	good := s.region(size)
	shared, huge, dontfork, wipe := s.region(size), s.region(size), s.region(size), s.region(size)
	smaller, readonly, srcOnly, kind := s.region(size), s.region(size), s.region(size), s.region(size)
	extra, written, touched := s.region(2*size), s.region(size), s.region(size)

	steps := [][2]string{}
	both := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		steps = append(steps, [2]string{"src", line}, [2]string{"dst", line})
	}
	only := func(who, format string, args ...any) {
		steps = append(steps, [2]string{who, fmt.Sprintf(format, args...)})
	}
	both("map %d %d anon rw", good, size)
	only("nobody", "map %d %d anon rw", good, size)
	both("map %d %d shared rw", shared, size)
	both("map %d %d hugetlb rw", huge, size)
	both("map %d %d anon rw", dontfork, size)
	both("madvise %d %d %d", dontfork, size, madvDontfork)
	both("map %d %d anon rw", wipe, size)
	both("madvise %d %d %d", wipe, size, madvWipeonfork)
	only("src", "map %d %d anon rw", smaller, size)
	only("dst", "map %d %d anon rw", smaller, size/2)
	only("src", "map %d %d anon rw", readonly, size)
	only("dst", "map %d %d anon r", readonly, size)
	only("src", "map %d %d anon rw", srcOnly, size)
	if err := os.WriteFile("/tmp/vcp-kind", make([]byte, size), 0o644); err != nil {
		return err
	}
	only("src", "map %d %d anon rw", kind, size)
	only("dst", "map %d %d file rw /tmp/vcp-kind", kind, size)
	both("map %d %d anon rw", extra, size)
	only("dst", "map %d %d anon rw", extra+size, size)
	both("map %d %d anon rw", written, size)
	both("map %d %d anon rw", touched, size)
	for _, a := range []uint64{good, shared, huge, dontfork, wipe, smaller, readonly, srcOnly, kind, extra, written, touched} {
		only("src", "fill %d %d 9 0", a, min(size, 2*mib))
	}
	only("dst", "write %d 1", written)
	only("dst", "read %d", touched)
	helpers := map[string]*proc{"src": src, "dst": dst, "nobody": nobody}
	for _, st := range steps {
		if _, err := helpers[st[0]].do("%s", st[1]); err != nil {
			return err
		}
	}
	vdso, haveVdso, err := src.areaNamed("[vdso]")
	if err != nil || !haveVdso {
		return fmt.Errorf("the source has no [vdso] to test a special mapping with (%v)", err)
	}
	vvar, haveVvar, err := src.areaNamed("[vvar]")
	if err != nil {
		return err
	}
	devNull, err := os.Open("/dev/null")
	if err != nil {
		return err
	}
	defer devNull.Close()

	// Running source first, while nothing is stopped.
	if err := expectErr(s, "source running", cherrypick.ErrSourceRunning, src.pidfd, dst.pidfd, good, size); err != nil {
		return err
	}
	if a, err := dst.areaAt(good); err != nil || a.rss != 0 {
		return fmt.Errorf("a refused call changed the destination (Rss %d kB, %v)", a.rss, err)
	}
	if err := src.stop(); err != nil {
		return err
	}

	call := func(srcFd, dstFd int, addr, length uint64) func() error {
		return func() error {
			_, err := s.dev.Cherrypick(srcFd, dstFd, addr, length)
			return err
		}
	}
	sfd, dfd := src.pidfd, dst.pidfd
	cases := []refusal{
		{"unaligned start", cherrypick.ErrInvalid, call(sfd, dfd, good+1, size)},
		{"unaligned length", cherrypick.ErrInvalid, call(sfd, dfd, good, size-1)},
		{"zero length", cherrypick.ErrInvalid, call(sfd, dfd, good, 0)},
		{"range in kernel space", cherrypick.ErrInvalid, call(sfd, dfd, 0xffff800000000000, pageSize)},
		{"range with no area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, s.region(size), size)},
		{"flags set", cherrypick.ErrInvalid, func() error {
			err := rawCherrypick(&rawArgs{src: int32(sfd), dst: int32(dfd), start: good, length: size, flags: 1})
			if errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("%w (%w)", cherrypick.ErrInvalid, err)
			}
			return err
		}},
		{"no CAP_SYS_ADMIN/CAP_CHECKPOINT_RESTORE", cherrypick.ErrNotPermitted, func() error {
			return onThreadWithout([]int{capSysAdmin, capCheckpointRestore}, call(sfd, dfd, good, size))
		}},
		{"ptrace denied (other uid, no CAP_SYS_PTRACE)", cherrypick.ErrPtraceDenied, func() error {
			return onThreadWithout([]int{capSysPtrace}, call(sfd, nobody.pidfd, good, size))
		}},
		{"source not a pidfd", cherrypick.ErrNotPidfd, call(int(devNull.Fd()), dfd, good, size)},
		{"destination not a pidfd", cherrypick.ErrNotPidfd, call(sfd, int(devNull.Fd()), good, size)},
		{"negative pidfd", cherrypick.ErrNotPidfd, call(sfd, -1, good, size)},
		{"closed descriptor", cherrypick.ErrNotPidfd, call(sfd, 1<<20, good, size)},
		{"source exited", cherrypick.ErrProcessExited, call(gone.pidfd, dfd, good, size)},
		{"destination exited", cherrypick.ErrProcessExited, call(sfd, gone.pidfd, good, size)},
		{"same process", cherrypick.ErrSameMM, call(sfd, sfd, good, size)},
		{"MAP_SHARED", cherrypick.ErrUnsupportedArea, call(sfd, dfd, shared, size)},
		{"hugetlb", cherrypick.ErrUnsupportedArea, call(sfd, dfd, huge, size)},
		{"MADV_DONTFORK", cherrypick.ErrUnsupportedArea, call(sfd, dfd, dontfork, size)},
		{"MADV_WIPEONFORK", cherrypick.ErrUnsupportedArea, call(sfd, dfd, wipe, size)},
		{"[vdso]", cherrypick.ErrUnsupportedArea, call(sfd, dfd, vdso.start, vdso.end-vdso.start)},
		{"bounds differ", cherrypick.ErrLayoutMismatch, call(sfd, dfd, smaller, size)},
		{"protection differs", cherrypick.ErrLayoutMismatch, call(sfd, dfd, readonly, size)},
		{"range cuts an area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, good, size/2)},
		{"destination lacks the area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, srcOnly, size)},
		{"anonymous vs file", cherrypick.ErrLayoutMismatch, call(sfd, dfd, kind, size)},
		{"destination has an extra area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, extra, 2*size)},
		{"destination written", cherrypick.ErrNotEmpty, call(sfd, dfd, written, size)},
		{"destination read (zero page)", cherrypick.ErrNotEmpty, call(sfd, dfd, touched, size)},
	}
	if haveVvar {
		if !vvar.hasFlag("pf") && !vvar.hasFlag("io") && !vvar.hasFlag("mm") {
			return fmt.Errorf("[vvar] has flags %v: not PFN/IO/mixed-mapped as expected", vvar.flags)
		}
		cases = append(cases, refusal{"[vvar] (PFN map)", cherrypick.ErrUnsupportedArea, call(sfd, dfd, vvar.start, vvar.end-vvar.start)})
	}
	for _, c := range cases {
		err := c.run()
		if !errors.Is(err, c.want) {
			return fmt.Errorf("%s: got %v, want %v", c.what, err, c.want)
		}
		var op *cherrypick.OpError
		name := err.Error()
		if errors.As(err, &op) {
			name = unix.ErrnoName(op.Errno)
		}
		fmt.Printf("  refused as expected: %-46s %s\n", c.what, name)
	}
	// The same pair, with a valid request, works: the refusals were not
	// side effects of a broken setup.
	if _, err := s.dev.Cherrypick(sfd, dfd, good, size); err != nil {
		return fmt.Errorf("valid request after the refusals: %w", err)
	}
	return expectPattern(dst, good, 2*mib, 9, 0)
}
