package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// holdPerfEvent keeps one per-task perf event open for the VM's life, so
// that the kernel's perf_sched_events static key is switched on once, at
// boot, and never again. Every ptrace hardware breakpoint is a per-task
// perf event (CRIU's restore sets some), and the first one switches the key
// on, the last one's release off a second later: each switch patches the
// kernel's text in __schedule through int3 (text_poke_bp). Under TCG with
// two vCPUs a vCPU in __schedule now and then takes that int3 as an Oops,
// which ended one boot in a few. With this event held, CRIU's breakpoints
// only move a count.
func holdPerfEvent(ready string) int {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_DUMMY,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Bits:   unix.PerfBitDisabled,
	}
	// The event's descriptor stays open until the VM stops: this process
	// never exits.
	if _, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC); err != nil {
		fmt.Printf("hold-perf-event: perf_event_open: %v\n", err)
		return 1
	}
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		fmt.Printf("hold-perf-event: %v\n", err)
		return 1
	}
	for {
		unix.Pause()
	}
}
