// Command vcptest is the vma_cherrypick VM suite. It runs as PID 1's child
// in a busybox initramfs with the module loaded, and re-executes itself as
// helper processes ("vcptest helper") that own the memory being shared.
package main

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tclone/tclone/kernel/cherrypick"
)

const (
	kib = 1024
	mib = 1024 * kib
	gib = 1024 * mib
	// thpSize is the x86-64 PMD size.
	thpSize = 2 * mib
	// testTimeout bounds one test, so that a hang names its test.
	testTimeout = 120 * time.Second
)

// slowFactor stretches every time limit of the suite: the kernel parameter
// vcpslow=N, which the kernel hands to init as an environment variable, is
// set for kernels that run far slower than the stock ones under TCG (the
// KASAN + lockdep debug kernel).
var slowFactor = func() time.Duration {
	if n, err := strconv.Atoi(os.Getenv("vcpslow")); err == nil && n > 1 {
		return time.Duration(n)
	}
	return 1
}()

func slow(d time.Duration) time.Duration { return d * slowFactor }

type suite struct {
	dev      *cherrypick.Device
	nextAddr uint64
	rng      *rand.Rand
}

type testCase struct {
	name string
	fn   func(*suite) error
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "vcptest: "+format+"\n", args...)
	os.Exit(2)
}

// region hands out a fresh, THP-aligned address range that no helper uses:
// every test maps at addresses of its own, identical in source and
// destination.
func (s *suite) region(size uint64) uint64 {
	addr := s.nextAddr
	s.nextAddr += (size+thpSize-1)/thpSize*thpSize + thpSize
	return addr
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		helperMain()
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "hold-snapshot" {
		os.Exit(holdSnapshot(os.Args[2]))
	}
	if len(os.Args) > 2 && os.Args[1] == "hold-perf-event" {
		os.Exit(holdPerfEvent(os.Args[2]))
	}
	os.Exit(runSuite(os.Args[1:]))
}

func runSuite(only []string) int {
	seed := time.Now().UnixNano()
	fmt.Printf("vcptest: seed %d\n", seed)
	dev, err := cherrypick.Open()
	if err != nil {
		fmt.Printf("FAIL open: %v\n", err)
		fmt.Println("vcptest: 0 passed, 1 failed")
		return 1
	}
	defer dev.Close()
	s := &suite{dev: dev, nextAddr: 0x100000000000, rng: rand.New(rand.NewSource(seed))}

	tests := []testCase{
		{"version", testVersion},
		{"prototypes", testPrototypes},
		{"content-256m-holes", testContent256},
		{"several-destinations-source-exits", testSeveralDestinations},
		{"destination-forks", testDestinationForks},
		{"thp", testTHP},
		{"file-private", testFilePrivate},
		{"refusals", testRefusals},
		{"user-namespace", testUserNamespace},
		{"uprobes", testUprobes},
		{"lock-held-elsewhere", testLockHeldElsewhere},
		{"memcg", testMemcg},
		{"ksm", testKSM},
		{"mlocked", testMlocked},
		{"clone-vm-sibling", testCloneVMSibling},
		{"freezer", testFreezer},
		{"concurrent", testConcurrent},
		{"pinned", testPinned},
		{"rmap", testRmap},
		{"snapshot", testSnapshot},
		{"snapshot-frees", testSnapshotFrees},
		{"snapshot-refusals", testSnapshotRefusals},
		{"snapshot-device", testSnapshotDevice},
		{"snapshot-file-areas", testSnapshotFileAreas},
		{"snapshot-benchmark-1g", testSnapshotBenchmark},
		{"benchmark-1g", testBenchmark1G},
		{"stress", testStress},
	}
	passed, failed := 0, 0
	for _, name := range unknownNames(only, tests) {
		failed++
		fmt.Printf("FAIL selection: the suite has no test %q\n", name)
	}
	for _, tc := range tests {
		if !selected(only, tc.name) {
			continue
		}
		start := time.Now()
		watchdog := time.AfterFunc(slow(testTimeout), func() {
			fmt.Printf("FAIL %s: still running after %v; giving up on the suite\n", tc.name, slow(testTimeout))
			os.Exit(3)
		})
		err := tc.fn(s)
		watchdog.Stop()
		took := time.Since(start).Round(time.Millisecond)
		if err != nil {
			failed++
			fmt.Printf("FAIL %s (%v): %v\n", tc.name, took, err)
		} else {
			passed++
			fmt.Printf("PASS %s (%v)\n", tc.name, took)
		}
	}
	fmt.Printf("vcptest: %d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		return 1
	}
	return 0
}

// selected says whether the command line asks for a test: no names means
// all, names run only those, and names prefixed with "-" run all but those.
func selected(args []string, name string) bool {
	if len(args) == 0 {
		return true
	}
	var only, skip []string
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, "-"); ok {
			skip = append(skip, rest)
		} else {
			only = append(only, a)
		}
	}
	if contains(skip, name) {
		return false
	}
	return len(only) == 0 || contains(only, name)
}

// unknownNames lists the names on the command line (to run or, prefixed
// with "-", to leave out) that name no test of the suite: a test renamed
// or removed must not leave a selection that silently runs less.
func unknownNames(args []string, tests []testCase) []string {
	var unknown []string
	for _, a := range args {
		name := strings.TrimPrefix(a, "-")
		known := false
		for _, tc := range tests {
			known = known || strings.EqualFold(tc.name, name)
		}
		if !known {
			unknown = append(unknown, a)
		}
	}
	return unknown
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
