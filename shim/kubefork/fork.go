// Package kubefork forks a running container of a Kubernetes pod through
// the node's CRI (containerd with tclone as a runtime class's handler), as
// `podman container fork` does through Podman: the container's checkpoint,
// asked for through the CRI as the kubelet's checkpoint API asks for it, is
// a fork plan, and each sibling is a new pod whose container the CRI
// restores from it. The source pod's container is paused only for the
// capture; every sibling is a pod of its own, with its own name, hostname,
// UID and IP, on the same node. It is all or nothing: a fork that fails
// removes every pod it made.
//
// It runs on the node, as root, beside the CRI runtime: it talks to it with
// crictl, and leaves tclone the fork request where tclone's checkpoint on
// that node finds it.
package kubefork

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/runtime/calls"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
)

// MaxCount bounds the siblings of one fork, as for Podman.
const MaxCount = 32

// Options are a fork through the CRI.
type Options struct {
	// Node is the node's CRI; the siblings go to the source pod's
	// namespace. Its ctr resumes the source should the CRI's checkpoint
	// call fail without resuming it.
	Node
	// Count siblings (1..MaxCount); Name, when set, names them (NAME, or
	// NAME-1..NAME-N), else SOURCE-fork-<n>.
	Count int
	Name  string
	// Fork is the capture's options (memory, TCP, identity, timeout).
	Fork forkopts.Fork
	// ReadyTimeout bounds each sibling's create, restore and start.
	ReadyTimeout time.Duration
	// Store is tclone's store on this node (plan.DefaultStore()).
	Store plan.Store
}

// Pod is a source or sibling pod and its forked container.
type Pod struct {
	Name        string `json:"name"`
	Namespace   string `json:"namespace"`
	PodID       string `json:"pod_id"`
	Container   string `json:"container"`
	ContainerID string `json:"container_id"`
	Hostname    string `json:"hostname,omitempty"`
	IP          string `json:"ip,omitempty"`
	// RestoreMs is the sibling pod's run, and its container's restore
	// and start (not the wait between them, for the checkpoint's end).
	RestoreMs float64 `json:"restore_ms,omitempty"`
	// uid and podFile are a sibling pod's, for its container's restore.
	uid, podFile string
}

// Result is a fork done: the source, the siblings, and where time went.
type Result struct {
	Source Pod `json:"source"`
	// Call is this fork's nonce, the LabelCall of each sibling.
	Call string `json:"call"`
	// CheckpointMs is the CRI's checkpoint call: containerd pauses the
	// container, tclone captures it, containerd resumes it and archives
	// the checkpoint directory.
	CheckpointMs float64 `json:"checkpoint_ms"`
	// CapturePauseMs is the part of that pause tclone's capture held the
	// source (plan.Timings.SourcePauseMs).
	CapturePauseMs float64 `json:"capture_pause_ms"`
	Memory         string  `json:"memory,omitempty"`
	Siblings       []Pod   `json:"siblings"`
	TotalMs        float64 `json:"total_ms"`
}

func (o *Options) check() error {
	if err := o.Node.defaults(); err != nil {
		return err
	}
	if o.Count < 1 || o.Count > MaxCount {
		return fmt.Errorf("--count %d: between 1 and %d siblings", o.Count, MaxCount)
	}
	if o.Name != "" {
		if err := checkName(o.Name); err != nil {
			return fmt.Errorf("--name: %w", err)
		}
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	o.Fork.Uses = o.Count
	return o.Fork.Normalize()
}

// forker is one fork in progress.
type forker struct {
	opts  Options
	cri   crictl
	start time.Time
	call  string
	work  string
	src   Pod
	// srcPod and srcCtr are the source's CRI configurations.
	srcPod, srcCtr map[string]any
	// pods are the namespace's pods when the source was found.
	pods    []podItem
	handler string
	planDir string
	// made are the sibling pods made so far, in order; a pod maker adds
	// to them while the checkpoint's caller finishes (podMaker).
	mu   sync.Mutex
	made []*Pod
	res  Result
	// record is this call's, for a collector to undo it should this
	// process die (calls.Collect, run by the next fork and tclone gc).
	record *calls.Call
}

// Fork forks the container of target ("POD/CONTAINER", or "POD" for a pod
// with one container) into opts.Count new pods.
func Fork(ctx context.Context, target string, opts Options) (*Result, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	f := &forker{opts: opts, cri: opts.cri(), start: time.Now(), call: calls.NewNonce()}
	// What dead fork clients left (pods, plans, directories) goes first.
	if rep, err := calls.Collect(ctx, opts.Store); err != nil {
		logrus.Warnf("rolling back what dead fork clients left: %v", err)
	} else if len(rep.Calls) > 0 {
		logrus.Infof("rolled back %d fork calls whose clients died", len(rep.Calls))
	}
	if err := f.findSource(ctx, target); err != nil {
		return nil, err
	}
	names, err := f.names()
	if err != nil {
		return nil, err
	}
	work, err := calls.MkdirTemp(opts.Store, "tclone-fork-")
	if err != nil {
		return nil, err
	}
	f.work = work
	defer os.RemoveAll(work)
	f.record, err = calls.DirOf(opts.Store).Begin(calls.Record{Nonce: f.call, SourceID: f.src.ContainerID, CRI: opts.Endpoint, TempDirs: []string{work}})
	if err != nil {
		return nil, err
	}
	if err := f.run(ctx, names); err != nil {
		return nil, errors.Join(err, f.rollback(), f.record.End())
	}
	if err := f.record.End(); err != nil {
		return nil, errors.Join(fmt.Errorf("closing the record of this fork call: %w", err), f.rollback())
	}
	f.res.Source, f.res.Call = f.src, f.call
	for _, p := range f.made {
		f.res.Siblings = append(f.res.Siblings, *p)
	}
	f.res.TotalMs = ms(time.Since(f.start))
	return &f.res, nil
}

// run checkpoints the source and makes the siblings. Their pods are made
// as soon as the capture has let the source go, while containerd finishes
// its checkpoint call (it archives the container's filesystem, which the
// plan holds already); their containers are restored once the call is
// over and its archive written.
func (f *forker) run(ctx context.Context, names []string) error {
	pods := &podMaker{f: f, ctx: ctx, names: names, out: make(chan podMade, len(names)), done: make(chan struct{})}
	// Whatever happens, no pod is being made once run returns: the
	// rollback must see them all.
	defer pods.wait()
	archive, err := f.checkpoint(ctx, pods.start)
	if err != nil {
		return err
	}
	pods.start()
	for range names {
		made := <-pods.out
		if made.err != nil {
			return made.err
		}
		if err := f.restoreInto(ctx, made.pod, archive); err != nil {
			return err
		}
	}
	return nil
}

// podMaker makes the siblings' pods, one after the other, from when start
// is first called.
type podMaker struct {
	f     *forker
	ctx   context.Context
	names []string
	once  sync.Once
	out   chan podMade
	done  chan struct{}
	// stop ends the making after the pod under way.
	stop atomic.Bool
}

type podMade struct {
	pod *Pod
	err error
}

func (m *podMaker) start() {
	m.once.Do(func() {
		go func() {
			defer close(m.done)
			for _, n := range m.names {
				if m.stop.Load() || m.ctx.Err() != nil {
					return
				}
				p, err := m.f.makePod(m.ctx, n)
				m.out <- podMade{p, err}
				if err != nil {
					return
				}
			}
		}()
	})
}

// wait stops the making and returns once no pod is being made (at once if
// none was started). A pod under way is made, even when the fork was
// cancelled (makePod): a crictl cut short could leave containerd making it
// after the rollback looked.
func (m *podMaker) wait() {
	m.stop.Store(true)
	m.once.Do(func() { close(m.done) })
	<-m.done
}

// findSource resolves target to a running container of a ready pod that
// tclone runs, and reads their configurations.
func (f *forker) findSource(ctx context.Context, target string) error {
	src, err := f.cri.findContainer(ctx, f.opts.Namespace, target, "fork")
	if err != nil {
		return err
	}
	f.pods = src.pods
	podName, ci, pi := src.pod.Metadata.Name, src.ci, src.pi
	if bin := ci.Info.RuntimeOptions.BinaryName; ci.Info.RuntimeType != "io.containerd.runc.v2" || filepath.Base(bin) != "tclone" {
		return fmt.Errorf("container %s/%s is not run by tclone (runtime %s, binary %q): run its pod with a RuntimeClass whose handler is tclone (docs/kubernetes.md)",
			podName, src.ctr.Metadata.Name, ci.Info.RuntimeType, bin)
	}
	if ci.Info.Config == nil || pi.Info.Config == nil {
		return fmt.Errorf("the CRI runtime gives no configuration of pod %s (crictl inspectp): a fork needs it to make sibling pods", podName)
	}
	f.src = src.describe(f.opts.Namespace)
	f.srcPod, f.srcCtr, f.handler = pi.Info.Config, ci.Info.Config, src.pod.RuntimeHandler
	return nil
}

// names picks the siblings' pod names, refusing one the namespace's pods
// had taken when the source was found.
func (f *forker) names() ([]string, error) {
	taken := map[string]bool{}
	for _, p := range f.pods {
		taken[p.Metadata.Name] = true
	}
	names, err := siblingNames(f.src.Name, f.opts.Name, f.opts.Count, taken)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := checkName(n); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// checkpoint leaves tclone a fork request for the source container and
// has the CRI checkpoint it (containerd pauses it, which tclone leaves to
// its capture, has tclone capture a fork plan, resumes it, and archives
// the checkpoint directory, which refers to the plan). It calls released
// once tclone's capture is done, and returns the archive siblings are
// restored from.
func (f *forker) checkpoint(ctx context.Context, released func()) (string, error) {
	id := f.src.ContainerID
	intent := plan.Intent{ContainerID: id, Nonce: f.call, Fork: f.opts.Fork, CallerPaused: true}
	unlock, err := f.opts.Store.LockIntents(id)
	if err != nil {
		return "", fmt.Errorf("this must run on the pod's node, as root: %w", err)
	}
	defer unlock()
	if err := f.opts.Store.WriteIntent(intent); err != nil {
		return "", fmt.Errorf("leaving tclone the fork request (this must run on the pod's node, as root): %w", err)
	}
	defer f.opts.Store.RemoveIntent(id, intent.Nonce)
	exported := filepath.Join(f.work, "checkpoint.tar")
	// containerd resumes the source only when the call it paused it for
	// ends: the call is never cut short (crictl's own timeout is far past
	// the capture's). A cancelled fork tells tclone's capture to stop,
	// which ends the call at once.
	cancelled := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		if err := f.opts.Store.CancelIntent(id, intent.Nonce); err != nil {
			logrus.Warnf("telling the capture of %s to stop: %v", f.src.Name, err)
		}
	})
	timeout := f.opts.Fork.CaptureTimeout + 10*time.Minute
	began := time.Now()
	ended := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		f.watchRelease(id, intent.Nonce, ended, released)
	}()
	_, err = f.cri.runToEnd("--timeout", timeout.String(), "checkpoint", "--export", exported, id)
	close(ended)
	<-watched
	f.res.CheckpointMs = ms(time.Since(began))
	if !stop() {
		<-cancelled
		f.opts.Store.RemoveIntentCancel(id, intent.Nonce)
		if err == nil {
			err = context.Cause(ctx)
		}
	}
	if err != nil && f.opts.Store.PauseClaimed(id, intent.Nonce) {
		// containerd paused the running source for the call (tclone froze
		// it after the capture) and owed it a resume, which a call ended
		// by its deadline skips.
		if ctr, ok := f.opts.ctr(); ok {
			err = errors.Join(err, ctr.resumeIfPaused(id))
		}
	}
	if err != nil {
		if why, _ := f.opts.Store.TakeIntentResult(id, intent.Nonce); why != "" {
			return "", fmt.Errorf("checkpoint of %s/%s failed: %s", f.src.Name, f.src.Container, why)
		}
		return "", err
	}
	archive := filepath.Join(f.work, "fork.tar")
	ref, err := forkArchive(exported, archive)
	if ref != nil {
		f.planDir = ref.PlanDir
		if rerr := f.record.Update(func(r *calls.Record) { r.PlanDir = ref.PlanDir }); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		return "", err
	}
	os.Remove(exported)
	if p, err := plan.Read(f.planDir); err == nil {
		f.res.CapturePauseMs, f.res.Memory = p.Timings.SourcePauseMs, string(p.Memory)
	}
	return archive, nil
}

// releasePoll is how often a checkpoint looks whether tclone's capture is
// done.
const releasePoll = 5 * time.Millisecond

// watchRelease calls released once tclone has marked the capture of the
// intent with this nonce done (plan.Store.MarkIntentReleased), unless ended
// is closed first.
func (f *forker) watchRelease(id, nonce string, ended <-chan struct{}, released func()) {
	tick := time.NewTicker(releasePoll)
	defer tick.Stop()
	for {
		select {
		case <-ended:
			return
		case <-tick.C:
			if f.opts.Store.IntentReleased(id, nonce) {
				released()
				return
			}
		}
	}
}

// makePod makes the sibling pod name, whose container restoreInto
// restores.
func (f *forker) makePod(ctx context.Context, name string) (*Pod, error) {
	b := make([]byte, 16)
	rand.Read(b)
	sib := sibling{name: name, uid: hex.EncodeToString(b)}
	podCfg, err := siblingPodConfig(f.srcPod, sib, f.src.ContainerID, f.call)
	if err != nil {
		return nil, err
	}
	podFile := filepath.Join(f.work, name+"-pod.json")
	if err := writeJSON(podFile, podCfg); err != nil {
		return nil, err
	}
	if dir, _ := podCfg["log_directory"].(string); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("the sibling's log directory: %w", err)
		}
	}
	// A pod begun is finished, cancelled fork or not (podMaker.wait).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.opts.ReadyTimeout)
	defer cancel()
	began := time.Now()
	runp := []string{"runp"}
	if f.handler != "" {
		runp = append(runp, "--runtime", f.handler)
	}
	out, err := f.cri.run(ctx, append(runp, podFile)...)
	if err != nil {
		return nil, fmt.Errorf("sibling pod %s: %w", name, err)
	}
	p := &Pod{Name: name, Namespace: f.opts.Namespace, PodID: strings.TrimSpace(string(out)), Container: f.src.Container, Hostname: name,
		RestoreMs: ms(time.Since(began)), uid: sib.uid, podFile: podFile}
	f.mu.Lock()
	f.made = append(f.made, p)
	f.mu.Unlock()
	if err := f.record.Update(func(r *calls.Record) { r.Siblings = append(r.Siblings, p.PodID) }); err != nil {
		return nil, err
	}
	// Its address is the pod's from now on (the CRI's network plugin
	// gave it one as it made the pod).
	var pi podInspect
	if err := f.cri.json(ctx, &pi, "inspectp", "-o", "json", p.PodID); err != nil {
		return nil, err
	}
	p.IP = pi.Status.Network.IP
	return p, nil
}

// restoreInto restores the source container into its sibling pod p from
// the archive, and starts it.
func (f *forker) restoreInto(ctx context.Context, p *Pod, archive string) error {
	ctrCfg, err := siblingContainerConfig(f.srcCtr, archive, sibling{name: p.Name, uid: p.uid}, f.src.ContainerID, f.call)
	if err != nil {
		return err
	}
	ctrFile := filepath.Join(f.work, p.Name+"-container.json")
	if err := writeJSON(ctrFile, ctrCfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.ReadyTimeout)
	defer cancel()
	began := time.Now()
	out, err := f.cri.run(ctx, "create", p.PodID, ctrFile, p.podFile)
	if err != nil {
		return fmt.Errorf("sibling pod %s: restoring its container: %w", p.Name, err)
	}
	p.ContainerID = strings.TrimSpace(string(out))
	if _, err := f.cri.run(ctx, "start", p.ContainerID); err != nil {
		return fmt.Errorf("sibling pod %s: starting its restored container: %w", p.Name, err)
	}
	p.RestoreMs += ms(time.Since(began))
	var ci containerInspect
	if err := f.cri.json(ctx, &ci, "inspect", "-o", "json", p.ContainerID); err != nil {
		return err
	}
	if ci.Status.State != "CONTAINER_RUNNING" {
		return fmt.Errorf("sibling pod %s: its container is %s after its restore", p.Name, ci.Status.State)
	}
	return nil
}

// rollback removes every pod this call made (by its label, which also finds
// one whose creation was cut short) and the plan.
func (f *forker) rollback() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	ids := map[string]bool{}
	f.mu.Lock()
	made := slices.Clone(f.made)
	f.mu.Unlock()
	for _, p := range made {
		ids[p.PodID] = true
	}
	var labelled struct {
		Items []podItem `json:"items"`
	}
	if err := f.cri.json(ctx, &labelled, "pods", "-o", "json", "--label", LabelCall+"="+f.call); err == nil {
		for _, p := range labelled.Items {
			ids[p.ID] = true
		}
	} else {
		errs = append(errs, err)
	}
	for id := range ids {
		if id == "" {
			continue
		}
		// stopp tears the pod's network down; rmp removes it and its
		// containers.
		if _, err := f.cri.run(ctx, "stopp", id); err != nil {
			errs = append(errs, err)
		}
		if _, err := f.cri.run(ctx, "rmp", "--force", id); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, f.removePlan())
	if err := errors.Join(errs...); err != nil {
		logrus.Warnf("rolling back the fork of %s: %v", f.src.Name, err)
		return fmt.Errorf("rolling back: %w", err)
	}
	return nil
}

func (f *forker) removePlan() error {
	if f.planDir == "" || !f.opts.Store.Contains(f.planDir) {
		return nil
	}
	return f.opts.Store.Remove(f.planDir)
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// readReference reads the fork plan reference a CRI checkpoint archive's
// checkpoint directory holds.
func readReference(r io.Reader) (*plan.Reference, error) {
	var ref plan.Reference
	if err := json.NewDecoder(r).Decode(&ref); err != nil {
		return nil, fmt.Errorf("reading the checkpoint's fork plan reference: %w", err)
	}
	return &ref, nil
}
