package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tclone/tclone/test/bench/internal/holderreport"
)

const (
	busyboxImage   = "localhost/tclone-busybox:latest"
	workspaceImage = "localhost/tclone-workspace:latest"
)

// Workload is one source container's contents.
type Workload struct {
	Name        string
	Kind        string // procs, mem, workspace
	Procs       int    // nominal process count
	MemMiB      int    // nominal touched anonymous memory
	Description string
	Image       string
	Env         []string
	Cmd         []string
	// ReadyFiles must exist in the container before it is measured.
	ReadyFiles []string
	// Settle is waited after the ready files appear.
	Settle time.Duration
	// HostTree says the raw CRIU and fork() baselines can run an equivalent
	// tree on the host (the holder alone, without a container).
	HostTree bool
	// holder serve arguments, for HostTree workloads.
	HolderArgs []string
	// RunArgs are more `podman run` options (volumes, annotations).
	RunArgs []string
}

func procsWorkload(n int) Workload {
	w := holderWorkload(n, 0, "sleep")
	w.Name, w.Kind = fmt.Sprintf("procs-%d", n), "procs"
	w.Description = fmt.Sprintf("%d processes: the holder (1 ms ticker) and %d busybox `sleep`", n, n-1)
	return w
}

func memWorkload(mib, procs int) Workload {
	w := holderWorkload(procs, mib, "holder")
	w.Name, w.Kind = fmt.Sprintf("mem-%d", mib), "mem"
	w.Description = fmt.Sprintf("%d holder processes touching %d MiB of private anonymous memory between them", procs, mib)
	return w
}

// holderWorkload is a holder serve tree of procs processes holding mib MiB
// between them, with children of the given kind, in the busybox image.
func holderWorkload(procs, mib int, children string) Workload {
	args := []string{"--procs", strconv.Itoa(procs), "--mem-mib", strconv.Itoa(mib), "--children", children}
	return Workload{
		Procs:      procs,
		MemMiB:     mib,
		Image:      busyboxImage,
		Cmd:        append([]string{"/holder", "serve"}, args...),
		ReadyFiles: []string{holderreport.Path},
		Settle:     300 * time.Millisecond,
		HostTree:   true,
		HolderArgs: args,
	}
}

// workspacePy is the multi-threaded process of the workspace: 4 threads,
// each holding its share of the memory, touched.
const workspacePy = `
import os, threading, time
N = 4
mib = int(os.environ.get("TCB_PY_MIB", "200"))
blocks = []
def work(i):
    blocks.append(bytearray(os.urandom(1 << 20)) * max(1, mib // N))
    while True:
        time.sleep(0.05)
for i in range(N):
    threading.Thread(target=work, args=(i,), daemon=True).start()
while len(blocks) < N:
    time.sleep(0.05)
with open("/tmp/tcb-py.ready", "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(1)
`

// workspaceScript starts the realistic workspace under bash as PID 1.
const workspaceScript = `
/holder serve --procs 1 &
mkdir -p /root/work && cd /root/work
git init -q . && for i in $(seq 1 40); do head -c 50000 /dev/urandom > file$i.bin; done
git add -A && git -c user.email=bench@tclone -c user.name=bench commit -qm init
tmux new-session -d -s main -x 160 -y 48 -c /root/work
tmux split-window -t main -h -c /root/work
tmux new-window -t main -c /root/work
tmux send-keys -t main:0.0 'export PS1="work$ "; ls' Enter
(cd /tmp && exec python3 -m http.server 8000 >/dev/null 2>&1) &
python3 -c "$TCB_PY" &
wait
`

func workspaceWorkload(mib int) Workload {
	return Workload{
		Name: "workspace", Kind: "workspace", MemMiB: mib,
		Description: fmt.Sprintf("Debian workspace: bash, tmux (2 windows, 3 shells), a git repo of 2 MB, python3 http.server, a 4-thread python3 process holding %d MiB, the holder ticker", mib),
		Image:       workspaceImage,
		Env:         []string{"TCB_PY=" + workspacePy, "TCB_PY_MIB=" + strconv.Itoa(mib)},
		Cmd:         []string{"bash", "-c", workspaceScript},
		ReadyFiles:  []string{holderreport.Path, "/tmp/tcb-py.ready", "/tmp/tmux-0/default"},
		Settle:      time.Second,
	}
}

// Source is a running source container.
type Source struct {
	Name    string
	Runtime string
	InitPid int
	Holder  holderRef
	Started time.Time
}

// startSource runs w's container with runtime and waits until it is ready.
func (b *Bench) startSource(ctx context.Context, w Workload, name, runtime string) (*Source, error) {
	args := []string{"run", "-d", "--name", name, "--runtime", runtime,
		"-v", b.tools.Holder + ":/holder:ro", "--label", "io.tclone.bench=" + b.runID}
	for _, e := range w.Env {
		args = append(args, "-e", e)
	}
	args = append(args, w.RunArgs...)
	args = append(args, w.Image)
	args = append(args, w.Cmd...)
	b.track(name)
	out, _, err := b.tools.podman(ctx, args...)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.sourceIDs = append(b.sourceIDs, strings.TrimSpace(out))
	b.mu.Unlock()
	s := &Source{Name: name, Runtime: runtime, Started: time.Now()}
	pid, err := b.initPid(ctx, name)
	if err != nil {
		return nil, err
	}
	s.InitPid = pid
	deadline := time.Now().Add(3 * time.Minute)
	for _, f := range w.ReadyFiles {
		p := filepath.Join(fmt.Sprintf("/proc/%d/root", pid), f)
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				logs, _, _ := b.tools.podman(ctx, "logs", "--tail", "20", name)
				return nil, fmt.Errorf("%s: %s did not appear within 3 minutes; logs: %s", name, f, tail(logs, 800))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	hp, err := findHolder(pid)
	if err != nil {
		return nil, err
	}
	s.Holder = holderRef{pid: hp, report: filepath.Join(fmt.Sprintf("/proc/%d/root", pid), holderreport.Path)}
	sleepCtx(ctx, w.Settle)
	return s, nil
}

func (b *Bench) initPid(ctx context.Context, name string) (int, error) {
	out, _, err := b.tools.podman(ctx, "inspect", "--format", "{{.State.Pid}}", name)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s has no running init (State.Pid %q)", name, strings.TrimSpace(out))
	}
	return pid, nil
}

// containerMem sums the memory of a container's processes.
func (b *Bench) containerMem(ctx context.Context, name string) (MemUsage, error) {
	pid, err := b.initPid(ctx, name)
	if err != nil {
		return MemUsage{}, err
	}
	return treeMem(pid)
}

// idleGap is the observer's largest gap over one second without a fork.
func idleGap(ctx context.Context, h holderRef) (float64, error) {
	if _, err := h.poke(ctx); err != nil {
		return 0, err
	}
	sleepCtx(ctx, time.Second)
	r, err := h.poke(ctx)
	return r.MaxGapMs, err
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
