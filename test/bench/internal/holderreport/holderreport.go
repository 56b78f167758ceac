// Package holderreport is the report file that the holder's serve command
// writes and the harness reads: the ready marker and the observer ticker's
// largest gap.
package holderreport

// Path is where serve writes its report unless told otherwise; inside a
// benchmark container it is always there.
const Path = "/tmp/tcb-holder.json"

// Report is the content of the report file, written at ready and on each
// SIGUSR1.
type Report struct {
	// Seq counts the reports written, from 0 (the ready report).
	Seq   int64 `json:"seq"`
	Pid   int   `json:"pid"`
	Procs int   `json:"procs"`
	// MemKiB is the touched memory of the whole tree.
	MemKiB int64 `json:"mem_kib"`
	// MaxGapMs is the largest gap between two ticks of the 1 ms ticker
	// since the previous report.
	MaxGapMs float64 `json:"max_gap_ms"`
	Ticks    int64   `json:"ticks"`
	// ReadyMs is the time from serve's start to this report.
	ReadyMs float64 `json:"ready_ms"`
	// Writes are the writer's buckets since the previous report, oldest
	// first (serve --write only).
	Writes []WriteBucket `json:"writes,omitempty"`
}

// WriteBucket is what serve --write's writer did over one stretch of time:
// it rewrote Pages whole pages of its memory between StartNs and EndNs
// (Unix nanoseconds). A bucket closes at the writer's first check 10 ms
// or more after it opened, so a bucket the writer spent stopped (a
// frozen source) is as long as the stop, and ends where the writer ran
// again.
type WriteBucket struct {
	StartNs int64 `json:"start_ns"`
	EndNs   int64 `json:"end_ns"`
	Pages   int64 `json:"pages"`
}
