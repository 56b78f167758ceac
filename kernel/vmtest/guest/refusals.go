package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
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
	return rawCherrypickOn(os.O_RDWR, unsafe.Pointer(args))
}

// rawCherrypickOn makes the ioctl on a device opened with mode, with the
// argument structure at arg.
func rawCherrypickOn(mode int, arg unsafe.Pointer) error {
	f, err := os.OpenFile(cherrypick.DevicePath, mode, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const req = 3<<30 | 56<<16 | 0xE4<<8 | 1 // _IOWR(0xE4, 1, 56)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// readOnlyArgs calls with a valid request whose structure the caller can
// read but not write: the module must refuse before sharing anything, as it
// could not report the results.
func readOnlyArgs(args rawArgs) error {
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(page)
	*(*rawArgs)(unsafe.Pointer(&page[0])) = args
	if err := unix.Mprotect(page, unix.PROT_READ); err != nil {
		return err
	}
	return rawCherrypickOn(os.O_RDWR, unsafe.Pointer(&page[0]))
}

// asNamed turns a raw errno into the bindings' named error, as the bindings
// would have.
func asNamed(err error, errno unix.Errno, named error) error {
	if errors.Is(err, errno) {
		return fmt.Errorf("%w (%w)", named, err)
	}
	return err
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
	uffd, pkey, locked, noreserve := s.region(size), s.region(size), s.region(size), s.region(size)
	readSmall, shstk := s.region(size), s.region(size)

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
	only("src", "madvise %d %d %d", touched, size, madvHugepage)
	only("dst", "madvise %d %d %d", touched, size, madvNoHugepage)
	both("map %d %d anon rw", readSmall, size)
	both("madvise %d %d %d", readSmall, size, madvNoHugepage)
	both("map %d %d anon rw", uffd, size)
	both("map %d %d anon rw", pkey, size)
	both("map %d %d anon rw", locked, size)
	only("src", "mlock %d %d %d", locked, size, unix.MLOCK_ONFAULT)
	only("src", "map %d %d anon rw", noreserve, size)
	only("dst", "map %d %d anon-noreserve rw", noreserve, size)
	for _, a := range []uint64{good, shared, huge, dontfork, wipe, smaller, readonly, srcOnly, kind, extra, written, touched, uffd, pkey, locked, noreserve, readSmall} {
		only("src", "fill %d %d 9 0", a, min(size, 2*mib))
	}
	// After the fill: a missing-page fault in it would wait for a handler.
	only("src", "uffd %d %d", uffd, size)
	only("dst", "write %d 1", written)
	only("dst", "read %d", touched)
	only("dst", "read %d", readSmall)
	helpers := map[string]*proc{"src": src, "dst": dst, "nobody": nobody}
	for _, st := range steps {
		if _, err := helpers[st[0]].do("%s", st[1]); err != nil {
			return err
		}
	}
	// Protection keys need the CPU's PKU; say so rather than pass quietly.
	// The area is filled already: a new key denies access to the helper's
	// other threads, which would fault.
	key, pkeyErr := src.do("pkey %d %d", pkey, size)
	if pkeyErr == nil {
		fmt.Printf("  protection key %s on the source's area\n", key)
	} else {
		fmt.Printf("  NOT TESTED: protection keys (%v)\n", pkeyErr)
	}
	// Shadow stacks need CET, which qemu's TCG does not emulate.
	shstkErr := func() error {
		if _, err := src.do("shstk %d %d", shstk, size); err != nil {
			return err
		}
		_, err := dst.do("map %d %d anon rw", shstk, size)
		return err
	}()
	if shstkErr != nil {
		fmt.Printf("  NOT TESTED: shadow stack twin check (%v)\n", shstkErr)
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

	// Running source, then running destination; each refused before any
	// lock is taken, and again under the locks.
	if err := dst.stop(); err != nil {
		return err
	}
	if err := nobody.stop(); err != nil {
		return err
	}
	if a, err := src.areaAt(touched); err != nil || a.anonHuge == 0 {
		return fmt.Errorf("the source got no huge page to test a destination page table under (%v)", err)
	}
	if err := expectErr(s, "source running", cherrypick.ErrNotParked, src.pidfd, dst.pidfd, good, size); err != nil {
		return err
	}
	if err := src.stop(); err != nil {
		return err
	}
	if err := dst.cont(); err != nil {
		return err
	}
	if err := expectErr(s, "destination running", cherrypick.ErrNotParked, src.pidfd, dst.pidfd, good, size); err != nil {
		return err
	}
	if a, err := dst.areaAt(good); err != nil || a.rss != 0 {
		return fmt.Errorf("a refused call changed the destination (Rss %d kB, %v)", a.rss, err)
	}
	if err := dst.stop(); err != nil {
		return err
	}
	fmt.Printf("  refused as expected: %-46s %s\n", "source running", "EBUSY")
	fmt.Printf("  refused as expected: %-46s %s\n", "destination running", "EBUSY")

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
		{"unknown flag set", cherrypick.ErrInvalid, func() error {
			// Bit 0 is VCP_CHERRYPICK_SRC_SNAPSHOT (snapshot-device tests it).
			err := rawCherrypick(&rawArgs{src: int32(sfd), dst: int32(dfd), start: good, length: size, flags: 1 << 1})
			return asNamed(err, unix.EINVAL, cherrypick.ErrInvalid)
		}},
		{"device opened read-only", cherrypick.ErrNotPidfd, func() error {
			args := rawArgs{src: int32(sfd), dst: int32(dfd), start: good, length: size}
			return asNamed(rawCherrypickOn(os.O_RDONLY, unsafe.Pointer(&args)), unix.EBADF, cherrypick.ErrNotPidfd)
		}},
		{"argument structure read-only", cherrypick.ErrFault, func() error {
			err := readOnlyArgs(rawArgs{src: int32(sfd), dst: int32(dfd), start: good, length: size})
			if a, aerr := dst.areaAt(good); aerr != nil || a.rss != 0 {
				return fmt.Errorf("the call failed (%v) but changed the destination (Rss %d kB, %v)", err, a.rss, aerr)
			}
			return asNamed(err, unix.EFAULT, cherrypick.ErrFault)
		}},
		{"no CAP_SYS_ADMIN/CAP_CHECKPOINT_RESTORE", cherrypick.ErrNotPermitted, func() error {
			return onThreadWithout([]int{capSysAdmin, capCheckpointRestore}, call(sfd, dfd, good, size))
		}},
		{"ptrace denied on the destination (other uid)", cherrypick.ErrPtraceDenied, func() error {
			return onThreadWithout([]int{capSysPtrace}, call(sfd, nobody.pidfd, good, size))
		}},
		{"ptrace denied on the source (other uid)", cherrypick.ErrPtraceDenied, func() error {
			return onThreadWithout([]int{capSysPtrace}, call(nobody.pidfd, dfd, good, size))
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
		{"userfaultfd-registered source", cherrypick.ErrUnsupportedArea, call(sfd, dfd, uffd, size)},
		{"mlock mode differs", cherrypick.ErrLayoutMismatch, call(sfd, dfd, locked, size)},
		{"MAP_NORESERVE differs (VM_ACCOUNT)", cherrypick.ErrLayoutMismatch, call(sfd, dfd, noreserve, size)},
		{"bounds differ", cherrypick.ErrLayoutMismatch, call(sfd, dfd, smaller, size)},
		{"protection differs", cherrypick.ErrLayoutMismatch, call(sfd, dfd, readonly, size)},
		{"range cuts an area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, good, size/2)},
		{"destination lacks the area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, srcOnly, size)},
		{"anonymous vs file", cherrypick.ErrLayoutMismatch, call(sfd, dfd, kind, size)},
		{"destination has an extra area", cherrypick.ErrLayoutMismatch, call(sfd, dfd, extra, 2*size)},
		{"destination written", cherrypick.ErrNotEmpty, call(sfd, dfd, written, size)},
		{"destination page table under a source huge page", cherrypick.ErrNotEmpty, call(sfd, dfd, touched, size)},
	}
	if pkeyErr == nil {
		cases = append(cases, refusal{"protection key differs", cherrypick.ErrLayoutMismatch, call(sfd, dfd, pkey, size)})
	}
	if shstkErr == nil {
		cases = append(cases, refusal{"shadow stack against plain memory", cherrypick.ErrLayoutMismatch, call(sfd, dfd, shstk, size)})
	}
	if haveVvar {
		if !vvar.hasFlag("pf") && !vvar.hasFlag("io") && !vvar.hasFlag("mm") {
			return fmt.Errorf("[vvar] has flags %v: not PFN/IO/mixed-mapped as expected", vvar.flags)
		}
		cases = append(cases, refusal{"[vvar] (PFN map)", cherrypick.ErrUnsupportedArea, call(sfd, dfd, vvar.start, vvar.end-vvar.start)})
	}
	// Every case runs, and every mismatch is reported, not only the first.
	var failed []string
	for _, c := range cases {
		err := c.run()
		if !errors.Is(err, c.want) {
			failed = append(failed, fmt.Sprintf("%s: got %v, want %v", c.what, err, c.want))
			continue
		}
		var op *cherrypick.OpError
		name := err.Error()
		if errors.As(err, &op) {
			name = unix.ErrnoName(op.Errno)
		}
		fmt.Printf("  refused as expected: %-46s %s\n", c.what, name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d refusals wrong:\n  %s", len(failed), len(cases), strings.Join(failed, "\n  "))
	}
	// The same pair, with a valid request, works: the refusals were not
	// side effects of a broken setup.
	if _, err := s.dev.Cherrypick(sfd, dfd, good, size); err != nil {
		return fmt.Errorf("valid request after the refusals: %w", err)
	}
	if err := expectPattern(dst, good, 2*mib, 9, 0); err != nil {
		return err
	}
	// A destination that only read (zero pages, a page table) under a
	// source of small pages is empty enough: the read entries are dropped.
	if _, err := s.dev.Cherrypick(sfd, dfd, readSmall, size); err != nil {
		return fmt.Errorf("destination that read its area, source of small pages: %w", err)
	}
	return expectPattern(dst, readSmall, 2*mib, 9, 0)
}
