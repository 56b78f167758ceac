package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A helper is this program re-executed as a separate process that owns
// memory for the suite: the suite tells it over stdin what to map, fill or
// write, and it answers one line on stdout ("ok ..." or "err ...").

const pageSize = 4096

// pattern is the value of the w-th filled word of page i for a seed. Pages
// store it every 512 bytes, which catches a wrong page without making TCG
// store every word.
func pattern(seed uint64, page, w uintptr) uint64 {
	x := seed ^ (uint64(page)+1)*0x9E3779B97F4A7C15
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return x + uint64(w)
}

// isHole says whether page i is left untouched (never faulted in).
func isHole(seed uint64, page uintptr, holeMod uint64) bool {
	return holeMod != 0 && pattern(seed, page, 7)%holeMod == 0
}

const wordsPerPage = pageSize / 512

func fillRegion(base unsafe.Pointer, n uintptr, seed, holeMod uint64) {
	for p := uintptr(0); p < n/pageSize; p++ {
		if isHole(seed, p, holeMod) {
			continue
		}
		for w := uintptr(0); w < wordsPerPage; w++ {
			*(*uint64)(unsafe.Add(base, p*pageSize+w*512)) = pattern(seed, p, w)
		}
	}
}

func helperMain() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		reply, err := helperCommand(strings.Fields(in.Text()))
		if err != nil {
			fmt.Fprintf(out, "err %v\n", err)
		} else {
			fmt.Fprintf(out, "ok %s\n", reply)
		}
		out.Flush()
	}
}

func parseArgs(args []string, n int) ([]uint64, error) {
	if len(args) < n {
		return nil, fmt.Errorf("want %d arguments, got %d", n, len(args))
	}
	vals := make([]uint64, n)
	for i := 0; i < n; i++ {
		v, err := strconv.ParseUint(args[i], 0, 64)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return vals, nil
}

// ptr turns an address the suite chose (and the helper mapped with
// MAP_FIXED_NOREPLACE) into a pointer. The memory is not Go-managed, so the
// garbage collector's pointer rules do not apply to it.
func ptr(addr uint64) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(nil), uintptr(addr))
}

func helperCommand(f []string) (string, error) {
	if len(f) == 0 {
		return "", fmt.Errorf("empty command")
	}
	cmd, args := f[0], f[1:]
	switch cmd {
	case "map": // map ADDR LEN KIND PROT [PATH]
		if len(args) < 4 {
			return "", fmt.Errorf("map ADDR LEN KIND PROT [PATH]")
		}
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return "", mapRegion(v[0], v[1], args[2], args[3], args[4:])
	case "unmap":
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return "", unix.MunmapPtr(ptr(v[0]), uintptr(v[1]))
	case "madvise": // madvise ADDR LEN ADVICE
		v, err := parseArgs(args, 3)
		if err != nil {
			return "", err
		}
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(v[0]), uintptr(v[1]), uintptr(v[2]))
		if errno != 0 {
			return "", fmt.Errorf("madvise %d: %w", v[2], errno)
		}
		return "", nil
	case "fill": // fill ADDR LEN SEED HOLEMOD
		v, err := parseArgs(args, 4)
		if err != nil {
			return "", err
		}
		fillRegion(ptr(v[0]), uintptr(v[1]), v[2], v[3])
		return "", nil
	case "write": // write ADDR VALUE
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		*(*uint64)(ptr(v[0])) = v[1]
		return "", nil
	case "read": // read ADDR
		v, err := parseArgs(args, 1)
		if err != nil {
			return "", err
		}
		return strconv.FormatUint(*(*uint64)(ptr(v[0])), 10), nil
	case "sum": // sum ADDR LEN
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return strconv.FormatUint(sumWords(ptr(v[0]), uintptr(v[1])), 10), nil
	case "fork": // fork ADDR LEN: the child's checksum of the region
		v, err := parseArgs(args, 2)
		if err != nil {
			return "", err
		}
		return forkAndSum(ptr(v[0]), uintptr(v[1]))
	case "forktime": // fork with a child that exits at once: clone()'s cost
		pid, took, err := rawFork(childExit, nil, 0, -1)
		if err != nil {
			return "", err
		}
		if err := waitExit(pid); err != nil {
			return "", err
		}
		return strconv.FormatInt(took.Nanoseconds(), 10), nil
	case "exit":
		os.Exit(0)
	}
	return helperCommandMore(cmd, args)
}

func mapRegion(addr, length uint64, kind, prot string, rest []string) error {
	p := unix.PROT_READ
	if prot == "rw" {
		p |= unix.PROT_WRITE
	}
	flags := unix.MAP_FIXED_NOREPLACE
	fd := -1
	switch kind {
	case "anon":
		flags |= unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	case "anon-noreserve": // no commit charge: VM_ACCOUNT clear
		flags |= unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE
	case "shared":
		flags |= unix.MAP_SHARED | unix.MAP_ANONYMOUS
	case "hugetlb":
		flags |= unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB
	case "file":
		if len(rest) != 1 {
			return fmt.Errorf("map file needs a path")
		}
		f, err := os.OpenFile(rest[0], os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fd = int(f.Fd())
		flags |= unix.MAP_PRIVATE
	case "memfd": // a private mapping of a new memfd holding MEMFD_FILL bytes
		memfd, err := unix.MemfdCreate("vcp-private", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("memfd_create: %w", err)
		}
		f := os.NewFile(uintptr(memfd), "memfd")
		defer f.Close()
		if _, err := f.Write(bytes.Repeat([]byte{memfdFill}, int(length))); err != nil {
			return fmt.Errorf("filling the memfd: %w", err)
		}
		fd = memfd
		flags |= unix.MAP_PRIVATE
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	got, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(addr), uintptr(length), uintptr(p), uintptr(flags), uintptr(fd), 0)
	if errno != 0 {
		return fmt.Errorf("mmap %s %#x+%#x: %w", kind, addr, length, errno)
	}
	if uint64(got) != addr {
		return fmt.Errorf("mmap %s returned %#x, want %#x", kind, got, addr)
	}
	return nil
}

func forkAndSum(base unsafe.Pointer, n uintptr) (string, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return "", err
	}
	defer unix.Close(fds[0])
	pid, _, err := rawFork(childSumAndWrite, base, n, fds[1])
	unix.Close(fds[1])
	if err != nil {
		return "", err
	}
	var buf [8]byte
	got, rerr := unix.Read(fds[0], buf[:])
	if werr := waitExit(pid); werr != nil {
		return "", werr
	}
	if rerr != nil || got != 8 {
		return "", fmt.Errorf("read the child's checksum: %d bytes, %v", got, rerr)
	}
	return strconv.FormatUint(*(*uint64)(unsafe.Pointer(&buf[0])), 10), nil
}
