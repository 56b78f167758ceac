package main

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const sampleStatus = `Name:	workload
Umask:	0022
State:	S (sleeping)
Tgid:	8104
Pid:	8115
SigQ:	0/62946
SigPnd:	0000000000000000
ShdPnd:	0000000000000000
SigBlk:	0000000000000200
SigIgn:	0000000000000000
SigCgt:	fffffffffffefeff
`

func TestParseSigBlk(t *testing.T) {
	got, err := parseSigBlk(strings.NewReader(sampleStatus), "status")
	if err != nil {
		t.Fatal(err)
	}
	if got != "0000000000000200" {
		t.Fatalf("parseSigBlk = %q, want 0000000000000200", got)
	}
}

func TestParseSigBlkErrors(t *testing.T) {
	for name, status := range map[string]string{
		"missing":   "Name:\tx\nSigPnd:\t0000000000000000\n",
		"malformed": "SigBlk:\tnot-hex\n",
		"empty":     "",
	} {
		if got, err := parseSigBlk(strings.NewReader(status), name); err == nil {
			t.Errorf("%s: parseSigBlk = %q, want an error", name, got)
		}
	}
}

func TestMaskHasSignal(t *testing.T) {
	for _, tc := range []struct {
		mask string
		sig  unix.Signal
		want bool
	}{
		{"0000000000000200", unix.SIGUSR1, true},
		{"0000000000000200", unix.SIGUSR2, false},
		{"0000000000000000", unix.SIGUSR1, false},
		{"fffffffffffffeff", unix.SIGKILL, false},
		{"0000000000000001", unix.SIGHUP, true},
		{"8000000000000000", unix.Signal(64), true},
	} {
		got, err := maskHasSignal(tc.mask, tc.sig)
		if err != nil || got != tc.want {
			t.Errorf("maskHasSignal(%s, %d) = %v, %v; want %v", tc.mask, tc.sig, got, err, tc.want)
		}
	}
	if _, err := maskHasSignal("xyz", unix.SIGUSR1); err == nil {
		t.Error("a malformed mask was accepted")
	}
}

func TestSigset(t *testing.T) {
	set := sigset(unix.SIGUSR1)
	if set.Val[0] != 0x200 {
		t.Fatalf("sigset(SIGUSR1).Val[0] = %#x, want 0x200", set.Val[0])
	}
	for i, v := range set.Val[1:] {
		if v != 0 {
			t.Fatalf("sigset(SIGUSR1).Val[%d] = %#x, want 0", i+1, v)
		}
	}
}

// The tests below start real threads and kernel objects; they leak them
// (the threads run for ever by design), which is fine in a test binary.

func TestCounterThreads(t *testing.T) {
	ct, err := startCounterThreads(2)
	if err != nil {
		t.Fatal(err)
	}
	first := ct.snapshot()
	// One of them may well be the main thread (tid == pid): that is a
	// thread like any other.
	if first[0].TID == first[1].TID || first[0].TID == 0 {
		t.Fatalf("threads do not have distinct tids: %+v", first)
	}
	mask, err := readSigBlk(first[sigblkThread].TID)
	if err != nil {
		t.Fatal(err)
	}
	if blocked, _ := maskHasSignal(mask, unix.SIGUSR1); !blocked {
		t.Fatalf("thread %d's SigBlk is %s, SIGUSR1 not blocked", first[sigblkThread].TID, mask)
	}
	mask, err = readSigBlk(first[1].TID)
	if err != nil {
		t.Fatal(err)
	}
	if blocked, _ := maskHasSignal(mask, unix.SIGUSR1); blocked {
		t.Fatalf("thread %d also blocks SIGUSR1 (SigBlk %s)", first[1].TID, mask)
	}
	if !waitUntil(2*time.Second, func() bool {
		now := ct.snapshot()
		return now[0].Count > first[0].Count && now[1].Count > first[1].Count
	}) {
		t.Fatal("counter threads do not count")
	}
}

func TestTimer(t *testing.T) {
	tm, err := startTimer()
	if err != nil {
		t.Fatal(err)
	}
	iv, err := tm.interval()
	if err != nil {
		t.Fatal(err)
	}
	if iv != timerInterval {
		t.Fatalf("interval = %v, want %v", iv, timerInterval)
	}
	if !waitUntil(2*time.Second, func() bool { return tm.ticks.Load() >= 3 }) {
		t.Fatalf("timer ticked %d times in 2s", tm.ticks.Load())
	}
}

func TestEventLoop(t *testing.T) {
	e, err := startEventLoop()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ping(); err != nil {
		t.Fatal(err)
	}
	if e.total.Load() != 0 {
		t.Fatal("a ping changed the eventfd total")
	}
	if err := e.add(5); err != nil {
		t.Fatal(err)
	}
	if err := e.add(2); err != nil {
		t.Fatal(err)
	}
	if got := e.total.Load(); got != 7 {
		t.Fatalf("total = %d after writing 5 and 2, want 7", got)
	}
	if e.wakeups.Load() < 3 {
		t.Fatalf("only %d epoll wakeups for a ping and two writes", e.wakeups.Load())
	}
}
