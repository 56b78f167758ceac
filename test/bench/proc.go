package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

// MemUsage sums smaps_rollup over every process of a tree.
type MemUsage struct {
	Procs int `json:"procs"`
	// RssKiB counts shared pages once per process that maps them.
	RssKiB int64 `json:"rss_kib"`
	// PssKiB divides each shared page between the processes sharing it.
	PssKiB     int64 `json:"pss_kib"`
	PssAnonKiB int64 `json:"pss_anon_kib"`
	AnonKiB    int64 `json:"anon_kib"`
}

func pidNS(pid int) (string, error) {
	return os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
}

// nsProcs lists the host PIDs of every process in the PID namespace of pid
// (a container's or a restored tree's init).
func nsProcs(pid int) ([]int, error) {
	ns, err := pidNS(pid)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if n, err := pidNS(p); err == nil && n == ns {
			out = append(out, p)
		}
	}
	return out, nil
}

// treeMem sums Rss, Pss and anonymous memory of the processes in pid's PID
// namespace.
func treeMem(pid int) (MemUsage, error) {
	pids, err := nsProcs(pid)
	if err != nil {
		return MemUsage{}, err
	}
	var m MemUsage
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", p))
		if err != nil || len(b) == 0 {
			continue // exited, or a kernel thread
		}
		m.Procs++
		m.RssKiB += rollup(b, "Rss:")
		m.PssKiB += rollup(b, "Pss:")
		m.PssAnonKiB += rollup(b, "Pss_Anon:")
		m.AnonKiB += rollup(b, "Anonymous:")
	}
	if m.Procs == 0 {
		return m, fmt.Errorf("no process readable in the PID namespace of %d", pid)
	}
	return m, nil
}

func rollup(b []byte, field string) int64 {
	for _, line := range bytes.Split(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte(field)); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(rest)), " kB"), 10, 64)
			return v
		}
	}
	return 0
}

// holderRef addresses the observer ticker of one source: the holder's host
// PID, which is signalled, and its report file as seen from the host.
type holderRef struct {
	pid    int
	report string
}

func (h holderRef) read() (holderreport.Report, error) {
	var r holderreport.Report
	b, err := os.ReadFile(h.report)
	if err != nil {
		return r, err
	}
	err = json.Unmarshal(b, &r)
	return r, err
}

// poke asks the holder for a fresh report (which resets its largest gap)
// and returns it.
func (h holderRef) poke(ctx context.Context) (holderreport.Report, error) {
	return h.signal(ctx, syscall.SIGUSR1)
}

// dirty has the holder write its --dirty-kib of memory anew, and returns
// the report it writes after.
func (h holderRef) dirty(ctx context.Context) (holderreport.Report, error) {
	return h.signal(ctx, syscall.SIGUSR2)
}

func (h holderRef) signal(ctx context.Context, sig syscall.Signal) (holderreport.Report, error) {
	old, err := h.read()
	if err != nil {
		return old, fmt.Errorf("reading the observer's report: %w", err)
	}
	if err := syscall.Kill(h.pid, sig); err != nil {
		return old, fmt.Errorf("signalling the observer (pid %d): %w", h.pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err := h.read(); err == nil && r.Seq > old.Seq {
			return r, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return old, fmt.Errorf("the observer (pid %d) did not answer within 10s", h.pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// findHolder finds the holder serve process in the PID namespace of init.
func findHolder(init int) (int, error) {
	pids, err := nsProcs(init)
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) >= 2 && filepath.Base(args[0]) == "holder" && args[1] == "serve" {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no holder serve process in the PID namespace of %d", init)
}

// waitGone waits until pid has exited (or is a zombie), for trees this
// benchmark killed but cannot reap.
func waitGone(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dirBytes sums the sizes of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
