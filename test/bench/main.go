// Command bench is tclone's benchmark harness (issue 5): fork latency,
// source pause and memory of `podman container fork`, side by side with
// stock Podman checkpoint/restore, raw CRIU and the fork() floor, measured
// in one run on the same container contents. It is a module of its own, so
// that its plotting dependencies stay out of tclone's go.mod; from
// test/bench:
//
//	go run . --out ../../bench-results --markdown ../../BENCHMARKS.md   # the full run (make bench)
//	go run . --quick --out /tmp/bench-quick                             # smoke test (make bench-quick)
//	go run . --check ../../bench-results                                # validate an earlier run's output
//
// It needs root, Podman with tclone installed (hack/install.sh), crun,
// CRIU, unshare, the local images localhost/tclone-busybox and
// localhost/tclone-workspace, and the Go toolchain (it builds its static
// in-container workload, ./holder of this module, unless --holder is given).
//
// Outputs: <out>/results.json (every sample, summaries, ratios, machine),
// <out>/*.png (plots) and the markdown report. The run exits non-zero when
// a measurement failed or the outputs are not well formed; the quick mode
// asserts only that, never a timing.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tclone/tclone/test/inheritfd"
)

// Config is the command line.
type Config struct {
	Quick            bool
	Out              string
	Markdown         string
	WarmReps         int
	LargeWarmReps    int
	LargeFromMiB     int
	ProcCounts       []int
	MemMiBs          []int
	MemProcs         int
	Workspace        bool
	WorkspaceMiB     int
	LazyKinds        []string
	TwinKinds        []string
	ForkRefMiB       int
	ForkRefReps      int
	FanOutCounts     []int
	FanOutReps       int
	FanOutVariants   []fanOutVariant
	FanOutExtraReps  int
	FanOutMemMiB     int
	VolumeMiB        int
	VolumeReps       int
	FilesOnlyMemMiB  int
	KSMMemMiB        int
	KSMWindow        time.Duration
	ProxyReps        int
	BranchMemMiB     int
	BranchReps       int
	CRIMemMiB        int
	CRIReps          int
	CRIEndpoint      string
	CRIImage         string
	ThroughputMemMiB int
	ThroughputReps   int
	ThroughputWindow time.Duration
	LaterDelay       time.Duration
	ArchiveDir       string
	CriuDir          string
	Only             []string
}

// Bench is one run.
type Bench struct {
	cfg   Config
	tools Tools
	svc   *service
	runID string
	tmp   string
	res   *Results
	start time.Time

	mu         sync.Mutex
	sourceIDs  []string
	containers []string
	pids       []int
	cmds       []*exec.Cmd
}

func main() {
	inheritfd.CloseOnExec()
	os.Exit(run())
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run() int {
	var cfg Config
	var procs, mems, fan, only, check, holder, lazyKinds, twinKinds, variants string
	var render bool
	flag.BoolVar(&cfg.Quick, "quick", false, "smoke test: tiny workloads, one warm repetition, short waits; checks only that the outputs are well formed")
	flag.StringVar(&cfg.Out, "out", "bench-results", "directory for results.json and the plots")
	flag.StringVar(&cfg.Markdown, "markdown", "", "markdown report to write (default <out>/BENCHMARKS.md)")
	flag.IntVar(&cfg.WarmReps, "reps", 5, "warm repetitions per workload and method (plus one cold)")
	flag.IntVar(&cfg.LargeWarmReps, "large-reps", 5, "warm repetitions for memory workloads of --large-from MiB and more")
	flag.IntVar(&cfg.LargeFromMiB, "large-from", 2048, "memory size from which --large-reps applies")
	flag.StringVar(&procs, "procs", "1,10,50,100,200", "process-count sweep")
	flag.StringVar(&mems, "mem", "0,256,1024,2048", "touched-memory sweep, MiB")
	flag.IntVar(&cfg.MemProcs, "mem-procs", 10, "processes of the memory sweep")
	flag.BoolVar(&cfg.Workspace, "workspace", true, "run the realistic workspace")
	flag.IntVar(&cfg.WorkspaceMiB, "workspace-mib", 200, "memory of the workspace's multi-threaded process")
	flag.StringVar(&fan, "fan-out", "1,4,16", "sibling counts of the fan-out experiment (empty: skip)")
	flag.StringVar(&lazyKinds, "lazy-kinds", "mem", "workload kinds (procs, mem, workspace) measured with tclone --memory lazy as well as copy (empty: none)")
	flag.StringVar(&twinKinds, "twin-kinds", "procs,mem", "workload kinds (procs, mem, workspace) measured with tclone --memory twin as well as copy (empty: none)")
	flag.IntVar(&cfg.ForkRefMiB, "fork-ref-mib", 1024, "memory of the fork() reference, MiB: one process touches it, then fork() is timed (0: skip it)")
	flag.IntVar(&cfg.ForkRefReps, "fork-ref-reps", 7, "fork() calls timed for the fork() reference (its median is reported)")
	flag.IntVar(&cfg.FanOutReps, "fan-out-reps", 5, "repetitions per fan-out count of the main (first) variant")
	flag.StringVar(&variants, "fan-out-variants", "lazy:0,lazy:1,copy:0", "fan-out variants MEMORY:PARALLEL (parallel 0: podman-fork's default); the first is the main one")
	flag.IntVar(&cfg.FanOutExtraReps, "fan-out-extra-reps", 3, "repetitions per fan-out count of the other variants")
	flag.IntVar(&cfg.FanOutMemMiB, "fan-out-mem", 256, "memory of the fan-out source, MiB, in --mem-procs processes")
	flag.IntVar(&cfg.VolumeMiB, "volume-mib", 1024, "data in the named volume of the volume experiment, MiB (0: skip it)")
	flag.IntVar(&cfg.VolumeReps, "volume-reps", 3, "warm repetitions per volume variant (plus one cold)")
	flag.IntVar(&cfg.FilesOnlyMemMiB, "files-only-mem", 1024, "memory of the larger files-only source, MiB")
	flag.IntVar(&cfg.KSMMemMiB, "ksm-mem", 1024, "memory of the --memory ksm source, MiB (0: skip it)")
	flag.DurationVar(&cfg.KSMWindow, "ksm-window", 60*time.Second, "how long the --memory ksm sibling is watched")
	flag.IntVar(&cfg.BranchMemMiB, "branch-mem", 1024, "memory of the durable branches' source, MiB (0: skip them)")
	flag.IntVar(&cfg.BranchReps, "branch-reps", 3, "warm rounds of fork and branch create (plus one cold)")
	flag.IntVar(&cfg.CRIMemMiB, "cri-mem", 1024, "memory of the source forked through Podman and through containerd's CRI, MiB (0: skip it)")
	flag.IntVar(&cfg.CRIReps, "cri-reps", 3, "warm rounds of the Podman fork and the CRI fork (plus one cold)")
	flag.StringVar(&cfg.CRIEndpoint, "cri-endpoint", "unix:///run/tclone-containerd/containerd.sock", "the CRI socket of a containerd with the runtime handler tclone (hack/containerd.sh)")
	flag.StringVar(&cfg.CRIImage, "cri-image", "localhost:5000/tclone-busybox:latest", "the CRI source's image (hack/registry.sh pushes it)")
	flag.IntVar(&cfg.ThroughputMemMiB, "throughput-mem", 1024, "memory of the write-heavy and idle sources whose speed after the fork is measured, MiB (0: skip them)")
	flag.IntVar(&cfg.ThroughputReps, "throughput-reps", 3, "forks of each throughput source per memory mode")
	flag.DurationVar(&cfg.ThroughputWindow, "throughput-window", 6*time.Second, "how long a throughput source is watched after its fork returned")
	flag.IntVar(&cfg.ProxyReps, "proxy-reps", 200, "requests per socket to measure what tclone's API service adds (a quarter of them for exec; 0: skip it)")
	flag.DurationVar(&cfg.LaterDelay, "later", 30*time.Second, "when to read memory again after the cold fork")
	flag.StringVar(&cfg.ArchiveDir, "archive-dir", "/dev/shm", "where stock Podman's export archives go (tmpfs, like tclone's plans)")
	flag.StringVar(&cfg.CriuDir, "criu-dir", "/dev/shm", "where raw CRIU's images go (tmpfs)")
	flag.StringVar(&only, "only", "", "comma-separated workload names to run (for debugging; the others are skipped)")
	flag.StringVar(&check, "check", "", "only validate the outputs in this directory (and --markdown) and exit")
	flag.BoolVar(&render, "render", false, "only redraw the plots and the markdown from <out>/results.json, then validate")
	flag.StringVar(&holder, "holder", "", "static holder binary (default: build ./holder of this module, test/bench)")
	flag.Parse()

	if cfg.Quick {
		setDefault := func(name, value string) {
			set := false
			flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
			if !set {
				flag.Set(name, value)
			}
		}
		setDefault("reps", "1")
		setDefault("large-reps", "1")
		setDefault("procs", "1,10")
		setDefault("mem", "0,32")
		setDefault("workspace-mib", "16")
		setDefault("fan-out", "1,2")
		setDefault("fan-out-reps", "1")
		setDefault("fan-out-extra-reps", "1")
		setDefault("fan-out-mem", "16")
		setDefault("later", "3s")
		setDefault("volume-mib", "8")
		setDefault("volume-reps", "1")
		setDefault("files-only-mem", "32")
		setDefault("ksm-mem", "16")
		setDefault("ksm-window", "4s")
		setDefault("proxy-reps", "12")
		setDefault("throughput-mem", "32")
		setDefault("throughput-reps", "1")
		setDefault("throughput-window", "1s")
		setDefault("branch-mem", "16")
		setDefault("branch-reps", "1")
		setDefault("cri-mem", "16")
		setDefault("cri-reps", "1")
		setDefault("fork-ref-mib", "32")
		setDefault("fork-ref-reps", "3")
	}
	var err error
	if cfg.ProcCounts, err = intList(procs); err == nil {
		if cfg.MemMiBs, err = intList(mems); err == nil {
			if cfg.FanOutCounts, err = intList(fan); err == nil {
				if cfg.FanOutVariants, err = parseVariants(variants); err == nil {
					if cfg.LazyKinds, err = parseKinds("--lazy-kinds", lazyKinds); err == nil {
						cfg.TwinKinds, err = parseKinds("--twin-kinds", twinKinds)
					}
				}
			}
		}
	}
	if err == nil && (cfg.ForkRefMiB < 0 || (cfg.ForkRefMiB > 0 && cfg.ForkRefReps < 1)) {
		err = fmt.Errorf("--fork-ref-mib must be 0 or more, and --fork-ref-reps 1 or more")
	}
	if err == nil && cfg.ThroughputMemMiB > 0 && (cfg.ThroughputReps < 1 || cfg.ThroughputWindow < 500*time.Millisecond) {
		err = fmt.Errorf("--throughput-reps must be 1 or more and --throughput-window 500ms or more (or --throughput-mem 0)")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if only != "" {
		cfg.Only = strings.Split(only, ",")
	}
	if check != "" {
		if cfg.Markdown == "" {
			cfg.Markdown = filepath.Join(check, "BENCHMARKS.md")
		}
		problems := validate(check, cfg.Markdown, nil)
		return report(problems)
	}
	if cfg.Markdown == "" {
		cfg.Markdown = filepath.Join(cfg.Out, "BENCHMARKS.md")
	}
	if render {
		data, err := os.ReadFile(filepath.Join(cfg.Out, "results.json"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		var r Results
		if err := json.Unmarshal(data, &r); err != nil {
			fmt.Fprintln(os.Stderr, "bench: results.json:", err)
			return 1
		}
		if err := writePlots(&r, cfg.Out); err != nil {
			fmt.Fprintln(os.Stderr, "bench: plots:", err)
			return 1
		}
		if err := writeMarkdown(&r, cfg.Markdown, cfg.Out); err != nil {
			fmt.Fprintln(os.Stderr, "bench: markdown:", err)
			return 1
		}
		return report(validate(cfg.Out, cfg.Markdown, nil))
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (Podman, CRIU, /proc of other processes)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &Bench{cfg: cfg, start: time.Now()}
	res, runErr := b.run(ctx, holder)
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "bench:", runErr)
		return 1
	}
	problems := validate(cfg.Out, cfg.Markdown, res)
	for _, f := range res.Failures {
		problems = append(problems, fmt.Sprintf("measurement failed: %s / %s rep %d: %s", f.Workload, f.Method, f.Rep, f.Error))
	}
	return report(problems)
}

func report(problems []string) int {
	if len(problems) == 0 {
		fmt.Fprintln(os.Stderr, "bench: outputs are well formed")
		return 0
	}
	fmt.Fprintf(os.Stderr, "bench: %d problem(s):\n", len(problems))
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "  -", p)
	}
	return 1
}

func (b *Bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *Bench) fail(workload, method string, rep int, err error) {
	b.logf("FAILED %s / %s rep %d: %v", workload, method, rep, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.res.Failures = append(b.res.Failures, Failure{Workload: workload, Method: method, Rep: rep, Error: err.Error()})
}

// Everything the run creates is tracked, so that it is removed on every
// path out, including ^C.

func (b *Bench) track(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Contains(b.containers, name) {
		b.containers = append(b.containers, name)
	}
}

func (b *Bench) trackPid(pid int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pids = append(b.pids, pid)
}

func (b *Bench) untrackPid(pid int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pids = slices.DeleteFunc(b.pids, func(p int) bool { return p == pid })
}

func (b *Bench) trackCmd(c *exec.Cmd) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cmds = append(b.cmds, c)
}

func (b *Bench) untrackCmd(c *exec.Cmd) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cmds = slices.DeleteFunc(b.cmds, func(x *exec.Cmd) bool { return x == c })
}

// removeContainers force-removes containers this run created.
func (b *Bench) removeContainers(names ...string) {
	if len(names) == 0 {
		return
	}
	// A fresh context: cleanup must run after ^C too.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// -v: a sibling's copies of named volumes are its anonymous volumes.
	args := append([]string{"rm", "-f", "-v", "-t", "0", "--ignore"}, names...)
	if _, _, err := b.tools.podman(ctx, args...); err != nil {
		b.logf("warning: removing %v: %v", names, err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.containers = slices.DeleteFunc(b.containers, func(n string) bool { return slices.Contains(names, n) })
}

// cleanup removes whatever is left: containers, restored host trees,
// unshare processes, the service, temporary files, archives and images.
func (b *Bench) cleanup() {
	b.mu.Lock()
	left := append([]string(nil), b.containers...)
	pids := append([]int(nil), b.pids...)
	cmds := append([]*exec.Cmd(nil), b.cmds...)
	b.mu.Unlock()
	if len(left) > 0 {
		b.removeContainers(left...)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
		waitGone(p, 10*time.Second)
	}
	for _, c := range cmds {
		if ch, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", c.Process.Pid, c.Process.Pid)); err == nil {
			for _, f := range strings.Fields(string(ch)) {
				if p, err := strconv.Atoi(f); err == nil {
					syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
		c.Process.Kill()
		c.Wait()
	}
	b.svc.stop()
	for _, dir := range []string{b.cfg.ArchiveDir, b.cfg.CriuDir} {
		if matches, _ := filepath.Glob(filepath.Join(dir, "tcb-"+b.runID+"-*")); len(matches) > 0 {
			for _, m := range matches {
				os.RemoveAll(m)
			}
		}
	}
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
	b.checkLeftovers()
}

// checkLeftovers warns about fork plans of this run's sources that tclone
// did not remove.
func (b *Bench) checkLeftovers() {
	// Every experiment removes what it made; what is left is a leak of
	// the experiment (cleanup removes it all the same).
	out, _, err := b.tools.podman(context.Background(), "ps", "-a", "--filter", "name=^tcb-"+b.runID+"-", "--format", "{{.Names}}")
	if left := strings.Fields(out); err == nil && len(left) > 0 {
		b.res.Failures = append(b.res.Failures, Failure{Workload: "*", Method: "*", Rep: -1,
			Error: fmt.Sprintf("containers of this run were left after its experiments: %s", strings.Join(left, ", "))})
	}
	plans, _ := filepath.Glob("/run/tclone/plans/*/plan.json")
	for _, p := range plans {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var pl struct {
			Source struct {
				ID string `json:"id"`
			} `json:"source"`
		}
		b.mu.Lock()
		mine := json.Unmarshal(data, &pl) == nil && slices.Contains(b.sourceIDs, pl.Source.ID)
		b.mu.Unlock()
		if mine {
			msg := fmt.Sprintf("a fork plan of this run was left behind: %s (run `tclone gc`)", filepath.Dir(p))
			b.logf("warning: %s", msg)
			b.res.Notes = append(b.res.Notes, msg)
		}
	}
}

func (b *Bench) selected(name string) bool {
	return len(b.cfg.Only) == 0 || slices.Contains(b.cfg.Only, name)
}

func (b *Bench) run(ctx context.Context, holder string) (*Results, error) {
	id := make([]byte, 3)
	rand.Read(id)
	b.runID = hex.EncodeToString(id)
	b.res = &Results{Schema: SchemaVersion, Quick: b.cfg.Quick, Started: time.Now().UTC(), Failures: []Failure{}, Notes: []string{}}
	var err error
	if b.tmp, err = os.MkdirTemp("", "tcb-bench-"); err != nil {
		return nil, err
	}
	defer b.cleanup()

	t := Tools{}
	if t.Podman, err = findTool("podman", "/usr/bin/podman"); err != nil {
		return nil, err
	}
	if t.PodmanFork, err = findTool("podman-fork", "/usr/local/bin/podman-fork"); err != nil {
		return nil, err
	}
	if t.Tclone, err = findTool("tclone", "/usr/local/bin/tclone"); err != nil {
		return nil, err
	}
	if t.Criu, err = findTool("criu", "/usr/sbin/criu"); err != nil {
		return nil, err
	}
	if t.Unshare, err = findTool("unshare", "/usr/bin/unshare"); err != nil {
		return nil, err
	}
	if holder != "" {
		if t.Holder, err = filepath.Abs(holder); err != nil {
			return nil, err
		}
	} else if t.Holder, err = buildHolder(ctx, b.tmp); err != nil {
		return nil, err
	}
	b.tools = t
	for _, img := range []string{busyboxImage, workspaceImage} {
		if _, _, err := t.podman(ctx, "image", "exists", img); err != nil {
			return nil, fmt.Errorf("image %s is missing (hack/setup-host.sh builds it)", img)
		}
	}
	b.res.Machine = describeMachine(ctx, t)
	startSums := binarySums(t.Tclone, t.PodmanFork)
	b.res.Config = RunConfig{
		WarmReps: b.cfg.WarmReps, LargeWarmReps: b.cfg.LargeWarmReps, LargeFromMiB: b.cfg.LargeFromMiB,
		ProcCounts: b.cfg.ProcCounts, MemMiBs: b.cfg.MemMiBs, MemProcs: b.cfg.MemProcs,
		Workspace: b.cfg.Workspace, WorkspaceMiB: b.cfg.WorkspaceMiB,
		LazyKinds: b.cfg.LazyKinds, TwinKinds: b.cfg.TwinKinds,
		ForkRefMiB: b.cfg.ForkRefMiB, ForkRefReps: b.cfg.ForkRefReps,
		FanOutCounts: b.cfg.FanOutCounts, FanOutReps: b.cfg.FanOutReps, FanOutMemMiB: b.cfg.FanOutMemMiB,
		FanOutVariants: variantNames(b.cfg.FanOutVariants), FanOutExtraReps: b.cfg.FanOutExtraReps,
		VolumeMiB: b.cfg.VolumeMiB, VolumeReps: b.cfg.VolumeReps, FilesOnlyMemMiB: b.cfg.FilesOnlyMemMiB,
		KSMMemMiB: b.cfg.KSMMemMiB, KSMWindowS: b.cfg.KSMWindow.Seconds(), ProxyReps: b.cfg.ProxyReps,
		BranchMemMiB: b.cfg.BranchMemMiB, BranchReps: b.cfg.BranchReps, CRIMemMiB: b.cfg.CRIMemMiB, CRIReps: b.cfg.CRIReps,
		ThroughputMemMiB: b.cfg.ThroughputMemMiB, ThroughputReps: b.cfg.ThroughputReps, ThroughputWindowS: b.cfg.ThroughputWindow.Seconds(),
		LaterDelayS: b.cfg.LaterDelay.Seconds(), ArchiveDir: b.cfg.ArchiveDir, CriuImageDir: b.cfg.CriuDir,
	}
	if b.svc, err = startService(t.Podman); err != nil {
		return nil, err
	}
	b.logf("run %s: tclone %s, podman service at %s", b.runID, b.res.Machine.Tclone, b.svc.url)

	var workloads []Workload
	for _, n := range b.cfg.ProcCounts {
		workloads = append(workloads, procsWorkload(n))
	}
	for _, m := range b.cfg.MemMiBs {
		workloads = append(workloads, memWorkload(m, b.cfg.MemProcs))
	}
	if b.cfg.Workspace {
		workloads = append(workloads, workspaceWorkload(b.cfg.WorkspaceMiB))
	}
	for _, w := range workloads {
		if !b.selected(w.Name) || ctx.Err() != nil {
			continue
		}
		b.logf("workload %s: %s", w.Name, w.Description)
		wr := &WorkloadResult{Name: w.Name, Kind: w.Kind, Procs: w.Procs, MemMiB: w.MemMiB,
			Description: w.Description, Methods: map[string]*MethodResult{}}
		b.res.Workloads = append(b.res.Workloads, wr)
		b.runContainerMethod(ctx, w, wr, MethodTclone)
		if slices.Contains(b.cfg.LazyKinds, w.Kind) {
			b.runContainerMethod(ctx, w, wr, MethodTcloneLazy)
		}
		if slices.Contains(b.cfg.TwinKinds, w.Kind) {
			b.runContainerMethod(ctx, w, wr, MethodTcloneTwin)
		}
		b.runContainerMethod(ctx, w, wr, MethodPodman)
		b.runCriu(ctx, w, wr)
		b.runFork(ctx, w, wr)
		for _, m := range wr.Methods {
			m.summarize()
		}
		wr.computeRatios()
		if wr.Kind == "workspace" {
			if m := wr.Methods[MethodTclone]; m != nil && len(m.Samples) > 0 {
				wr.Procs = int(m.Samples[0].Metrics["source_procs"])
			}
		}
		b.writeJSON() // partial results survive a crash later on
	}
	if b.cfg.ForkRefMiB > 0 && b.selected("fork-ref") && ctx.Err() == nil {
		b.logf("fork() of %d MiB, %d times", b.cfg.ForkRefMiB, b.cfg.ForkRefReps)
		b.res.ForkRef = b.runForkRef(ctx)
		b.writeJSON()
	}
	if len(b.cfg.FanOutCounts) > 0 && b.selected("fanout") && ctx.Err() == nil {
		b.logf("fan-out %v", b.cfg.FanOutCounts)
		b.res.FanOut = b.runFanOut(ctx)
	}
	if b.cfg.VolumeMiB > 0 && b.selected("volume") && ctx.Err() == nil {
		b.logf("named volume of %d MiB: share, copy, reflink", b.cfg.VolumeMiB)
		b.res.Volumes = b.runVolumes(ctx)
	}
	if b.selected("files-only") && ctx.Err() == nil {
		b.logf("files-only forks")
		b.res.FilesOnly = b.runFilesOnly(ctx)
	}
	if b.cfg.KSMMemMiB > 0 && b.selected("ksm") && ctx.Err() == nil {
		b.logf("--memory ksm of %d MiB, watched for %s", b.cfg.KSMMemMiB, b.cfg.KSMWindow)
		b.res.KSM = b.runKSM(ctx)
	}
	if b.cfg.ThroughputMemMiB > 0 && b.selected("throughput") && ctx.Err() == nil {
		b.logf("the source's write speed after its fork, %d MiB", b.cfg.ThroughputMemMiB)
		b.res.Throughput = b.runThroughput(ctx)
	}
	if b.cfg.ProxyReps > 0 && b.selected("rest-proxy") && ctx.Err() == nil {
		b.logf("tclone's API service in front of Podman's: %d requests each way", b.cfg.ProxyReps)
		b.res.Proxy = b.runProxy(ctx)
	}
	if b.cfg.BranchMemMiB > 0 && b.selected("branches") && ctx.Err() == nil {
		b.logf("durable branches of a %d MiB source", b.cfg.BranchMemMiB)
		b.res.Branches = b.runBranches(ctx)
	}
	if b.cfg.CRIMemMiB > 0 && b.selected("cri") && ctx.Err() == nil {
		b.logf("a %d MiB source forked through Podman and through containerd's CRI", b.cfg.CRIMemMiB)
		b.res.CRI = b.runCRI(ctx)
	}
	if ctx.Err() != nil {
		b.res.Failures = append(b.res.Failures, Failure{Workload: "*", Method: "*", Rep: -1, Error: "interrupted: " + ctx.Err().Error()})
	}
	b.checkLeftovers()
	// The host is shared: if tclone was reinstalled during the run, the
	// results mix two builds, and the run must say so.
	if end := binarySums(t.Tclone, t.PodmanFork); end != startSums {
		now := versionOf(context.Background(), t.Tclone, "--version")
		b.res.Failures = append(b.res.Failures, Failure{Workload: "*", Method: MethodTclone, Rep: -1,
			Error: fmt.Sprintf("tclone or podman-fork was replaced during the run (%s at the start, %s at the end): the results mix two builds; run again", b.res.Machine.Tclone, now)})
	}
	b.res.Headline = headline(b.res)
	b.res.Machine.LoadEnd = readFirstLine("/proc/loadavg")
	b.res.Finished = time.Now().UTC()
	b.res.DurationS = math.Round(time.Since(b.start).Seconds())
	b.res.Notes = append(b.res.Notes, standardNotes(b.cfg)...)
	sanitize(b.res)
	if err := b.writeJSON(); err != nil {
		return nil, err
	}
	if err := writePlots(b.res, b.cfg.Out); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	if err := writeMarkdown(b.res, b.cfg.Markdown, b.cfg.Out); err != nil {
		return nil, fmt.Errorf("markdown: %w", err)
	}
	if err := writeGitignore(b.cfg.Out); err != nil {
		return nil, err
	}
	b.logf("done: %s, %s", filepath.Join(b.cfg.Out, "results.json"), b.cfg.Markdown)
	return b.res, nil
}

func (b *Bench) writeJSON() error {
	if err := os.MkdirAll(b.cfg.Out, 0o755); err != nil {
		return err
	}
	sanitize(b.res)
	data, err := json.MarshalIndent(b.res, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(b.cfg.Out, "results.json.tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(b.cfg.Out, "results.json"))
}

// writeGitignore keeps only the results and the plots of the output
// directory under version control.
func writeGitignore(dir string) error {
	return os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("# written by test/bench: only the results and plots are meant to be committed\n*\n!.gitignore\n!results.json\n!*.png\n"), 0o644)
}

// sanitize replaces values JSON cannot hold (NaN, ±Inf) by 0; validation
// then reports them as missing.
func sanitize(r *Results) {
	fix := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = 0
		}
	}
	for _, w := range r.Workloads {
		for k, v := range w.Ratios {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				delete(w.Ratios, k)
			}
		}
		for _, m := range w.Methods {
			for _, s := range m.Samples {
				for k, v := range s.Metrics {
					fix(&v)
					s.Metrics[k] = v
				}
			}
		}
	}
	h := &r.Headline
	for _, hv := range []*HeadlineValues{&h.Lazy, &h.LazyCold, &h.Twin, &h.TwinCold} {
		for _, v := range []*float64{&hv.TclonePauseMs, &hv.PodmanPauseMs, &hv.TcloneGapMs, &hv.PodmanGapMs,
			&hv.TcloneFirstCommandMs, &hv.PodmanFirstCommandMs, &hv.PauseRatio, &hv.GapRatio, &hv.FirstCommandRatio} {
			fix(v)
		}
	}
	for i := range h.Targets {
		fix(&h.Targets[i].Value)
		fix(&h.Targets[i].Bound)
	}
	for _, v := range []*float64{&h.TclonePauseMs, &h.PodmanPauseMs, &h.TcloneGapMs, &h.PodmanGapMs,
		&h.TcloneFirstCommandMs, &h.PodmanFirstCommandMs, &h.PauseRatio, &h.GapRatio, &h.FirstCommandRatio,
		&h.TcloneMsPerProcess, &h.TclonePauseMsPerProcess, &h.PodmanMsPerProcess, &h.MarginalMsPerChild,
		&h.TwinMsPerProcess, &h.TwinPauseMsPerProcess,
		&h.Cold.TclonePauseMs, &h.Cold.PodmanPauseMs, &h.Cold.TcloneGapMs, &h.Cold.PodmanGapMs,
		&h.Cold.TcloneFirstCommandMs, &h.Cold.PodmanFirstCommandMs, &h.Cold.PauseRatio, &h.Cold.GapRatio, &h.Cold.FirstCommandRatio,
		&h.TclonePauseRange[0], &h.TclonePauseRange[1], &h.PodmanPauseRange[0], &h.PodmanPauseRange[1]} {
		fix(v)
	}
	if r.ForkRef != nil {
		fix(&r.ForkRef.MedianMs)
		for i := range r.ForkRef.ForkMs {
			fix(&r.ForkRef.ForkMs[i])
		}
	}
	if r.FanOut != nil {
		for _, v := range r.FanOut.Variants {
			fix(&v.MarginalMsPerChild)
			for _, m := range []map[string]float64{v.MarginalPairs, v.MarginalOverFirst} {
				for k, x := range m {
					if math.IsNaN(x) || math.IsInf(x, 0) {
						delete(m, k)
					}
				}
			}
		}
	}
}

// headline picks the numbers the closing note quotes.
func headline(r *Results) Headline {
	var h Headline
	var mem *WorkloadResult
	for _, w := range r.Workloads {
		if w.Kind != "mem" {
			continue
		}
		if w.MemMiB == 1024 {
			mem = w
			break
		}
		if mem == nil || w.MemMiB > mem.MemMiB {
			mem = w
		}
	}
	if mem != nil {
		t, s := mem.Methods[MethodTclone], mem.Methods[MethodPodman]
		h.MemWorkload = mem.Name
		h.HeadlineValues = headlineValues(t, s, (*MethodResult).warmMedian)
		h.Cold = headlineValues(t, s, (*MethodResult).coldValue)
		h.TclonePauseRange = t.warmRange("pause_ms")
		h.PodmanPauseRange = s.warmRange("pause_ms")
		if l := mem.Methods[MethodTcloneLazy]; l != nil {
			h.Lazy = headlineValues(l, s, (*MethodResult).warmMedian)
			h.LazyCold = headlineValues(l, s, (*MethodResult).coldValue)
		}
		if tw := mem.Methods[MethodTcloneTwin]; tw != nil {
			h.Twin = headlineValues(tw, s, (*MethodResult).warmMedian)
			h.TwinCold = headlineValues(tw, s, (*MethodResult).coldValue)
		}
	}
	h.TcloneMsPerProcess = procSlope(r, MethodTclone, "to_running_ms")
	h.TclonePauseMsPerProcess = procSlope(r, MethodTclone, "pause_ms")
	h.PodmanMsPerProcess = procSlope(r, MethodPodman, "to_running_ms")
	h.TwinMsPerProcess = procSlope(r, MethodTcloneTwin, "to_running_ms")
	h.TwinPauseMsPerProcess = procSlope(r, MethodTcloneTwin, "pause_ms")
	if r.FanOut != nil && len(r.FanOut.Variants) > 0 {
		h.MarginalMsPerChild = r.FanOut.Variants[0].MarginalMsPerChild
	}
	h.Targets = targets(r)
	return h
}

// headlineValues are the headline's numbers for tclone and stock Podman,
// each metric read with value: the warm median or the cold fork's.
func headlineValues(tclone, stock *MethodResult, value func(*MethodResult, string) float64) HeadlineValues {
	v := HeadlineValues{
		TclonePauseMs:        value(tclone, "pause_ms"),
		PodmanPauseMs:        value(stock, "pause_ms"),
		TcloneGapMs:          value(tclone, "observer_gap_ms"),
		PodmanGapMs:          value(stock, "observer_gap_ms"),
		TcloneFirstCommandMs: value(tclone, "first_command_ms"),
		PodmanFirstCommandMs: value(stock, "first_command_ms"),
	}
	v.PauseRatio = v.PodmanPauseMs / v.TclonePauseMs
	v.GapRatio = v.PodmanGapMs / v.TcloneGapMs
	v.FirstCommandRatio = v.PodmanFirstCommandMs / v.TcloneFirstCommandMs
	return v
}

// procSlope is the least-squares slope of a warm median against the
// process count over the process-count sweep.
func procSlope(r *Results, method, metric string) float64 {
	var xs, ys []float64
	for _, w := range r.Workloads {
		if w.Kind != "procs" {
			continue
		}
		if v := w.Methods[method].warmMedian(metric); !math.IsNaN(v) {
			xs = append(xs, float64(w.Procs))
			ys = append(ys, v)
		}
	}
	return slope(xs, ys)
}

func standardNotes(cfg Config) []string {
	notes := []string{
		"Cold is the first fork after the source started (one sample per workload and method); warm statistics are over the following repetitions.",
		"p95 interpolates linearly between order statistics; with 5 samples it lies between the two largest.",
		"tclone is driven through `podman container fork` (podman-fork) against a Podman API service this run starts; stock Podman through the podman CLI. Both timings include their client's start-up.",
		"tclone's first command is the `true` podman-fork runs in the sibling through the Podman API (`--ready exec`) as soon as it runs; stock Podman's is a `podman exec` CLI call, which also pays a podman start-up. Each tclone sample also records a `podman exec SIBLING true` the harness ran after podman-fork returned (cli_exec_ms), and the targets give the ratio with it too.",
		"`--print-stats` makes podman-fork wait until a sibling's memory is complete before it returns (and report memory_complete_ms); tclone's times to running and to the first command are its own figures for those moments, not its wall time. The fan-out runs without `--print-stats` (see there).",
		"tclone is Podman's default runtime on this machine. The podman CLI restores an imported checkpoint with the runtime its archive names (crun here) unless told otherwise, while Podman's API service uses its default runtime; the stock restore names crun explicitly (`podman --runtime crun container restore --import`), and every sample records the runtime Podman says the copy has (`podman inspect --format {{.OCIRuntime}}`) as restore_runtime.",
		"Stock Podman's pause is CRIU's freezing_time + frozen_time from `--print-stats`; raw CRIU's the same from its stats-dump; tclone's is its own freeze-to-thaw figure. The observer gap is measured the same way for all three.",
		"Stock Podman's tmpfs bytes are the export archive (written to " + cfg.ArchiveDir + " here); its disk bytes are CRIU's image directory in the source container's storage; `restore --import` writes those images once more under the new container (not counted).",
		"The source's root process ticks every 1 ms to measure the observer gap. Its copies in another PID namespace (tclone's siblings, stock Podman's restores; not raw CRIU's, restored in the host's) stop ticking within 128 ms: nothing reads their gaps, and each ticker takes 6-10% of a CPU here, which a fan-out's later restores would otherwise compete with.",
		"The fork() floor is fork() of one process holding as much anonymous memory as the whole source tree, plus one fork() of a tiny process for each other process of the tree.",
		"`--memory twin` takes each source process's memory as fork() does, by a twin cloned inside the pause, and drains the twins into page images after the source runs on; its memory complete is when the sibling's memory is, not when the drain ended.",
	}
	if cfg.LargeWarmReps < cfg.WarmReps {
		notes = append(notes, fmt.Sprintf("Memory workloads of %d MiB and more ran %d warm repetitions instead of %d, to keep the run short.", cfg.LargeFromMiB, cfg.LargeWarmReps, cfg.WarmReps))
	}
	return notes
}

// binarySums fingerprints the installed binaries by size and modification
// time.
func binarySums(paths ...string) string {
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			out = append(out, p+":missing")
			continue
		}
		out = append(out, fmt.Sprintf("%s:%d:%d", p, fi.Size(), fi.ModTime().UnixNano()))
	}
	return strings.Join(out, " ")
}
