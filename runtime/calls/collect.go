package calls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
)

// Podman is what a rollback needs from Podman.
type Podman interface {
	// Labelled maps the ID of every container carrying the label key
	// (stopped and created ones included) to the label's value.
	Labelled(ctx context.Context, key string) (map[string]string, error)
	// Remove removes a container by ID, by force, with its anonymous
	// volumes (a sibling's copies of the source's volumes); one already
	// gone is not an error.
	Remove(ctx context.Context, id string) error
}

// Report says what a collection undid.
type Report struct {
	Calls []Undone `json:"calls,omitempty"`
	// Kept are calls of Kubernetes forks whose CRI runtime could not be
	// reached (not running: nor are its pods), each with why: they are
	// undone by a later collection.
	Kept     []string `json:"calls_kept,omitempty"`
	Services []int    `json:"services_stopped,omitempty"`
	TempDirs []string `json:"temp_dirs_removed,omitempty"`
}

// Undone is one dead client's call, rolled back.
type Undone struct {
	Nonce    string        `json:"nonce"`
	Owner    journal.Owner `json:"owner"`
	Siblings []string      `json:"siblings_removed,omitempty"`
	PlanDir  string        `json:"plan_removed,omitempty"`
}

// Collector rolls back the calls of dead clients.
type Collector struct {
	Dir    Dir
	Store  plan.Store
	Podman Podman
	// CRI is what a rollback needs from the CRI runtime at an endpoint,
	// for the calls of Kubernetes forks (Record.CRI): the same two
	// things, for pods. Nil leaves such calls for a collector that has it.
	CRI func(endpoint string) Podman
	// TempDir is searched for dead clients' temporary directories; empty
	// means TempDir(Store). Never /tmp: a directory anyone can make there
	// must not lead a collector to remove or signal anything.
	TempDir string
}

// Collect rolls back, with Podman's own CLI, every fork call whose client
// died, and removes the temporary directories dead clients left, stopping
// first a Podman service such a client started for itself. It is what
// `tclone gc` runs.
//
// It calls Podman's CLI (the layout's Podman), so it must never run inside a runtime verb that
// Podman itself called (Podman may hold locks the command needs).
func Collect(ctx context.Context, store plan.Store) (*Report, error) {
	return Collector{Dir: DirOf(store), Store: store, Podman: PodmanCLI{Path: store.Podman},
		CRI: func(endpoint string) Podman { return CrictlCLI{Endpoint: endpoint} }}.Collect(ctx)
}

// Collect rolls back the calls of dead clients: first their Podman services
// are stopped (so none of them creates a container after the rollback
// looked), then their siblings, captures and directories are removed.
func (c Collector) Collect(ctx context.Context) (*Report, error) {
	rep := &Report{}
	root := c.TempDir
	if root == "" {
		root = c.Store.TempDir()
	}
	errTemp := collectTempDirs(root, time.Now(), rep)
	c.Dir.removeDeadTemps()
	dead, err := c.Dir.claimDead()
	if err != nil || len(dead) == 0 {
		return rep, errors.Join(errTemp, err)
	}
	errs := []error{errTemp}
	// The containers (or pods) of dead calls, listed once for each place
	// they were made: Podman ("") or a CRI endpoint.
	type runtime struct {
		rt       Podman
		labelled map[string]string
		err      error
	}
	runtimes := map[string]*runtime{}
	for _, call := range dead {
		where := call.rec.CRI
		r := runtimes[where]
		if where != "" && c.CRI == nil {
			// Not this collector's to undo, nor to warn about: its pods
			// are only reachable through the CRI (tclone gc, kube fork).
			errs = append(errs, call.release())
			continue
		}
		if r == nil {
			r = &runtime{rt: c.Podman}
			if where != "" {
				r.rt = c.CRI(where)
			}
			r.labelled, r.err = r.rt.Labelled(ctx, LabelCall)
			runtimes[where] = r
		}
		if r.err != nil {
			// Without the list, a claimed call is given back for later.
			errs = append(errs, call.release())
			if where != "" {
				// A CRI runtime that is down runs no pod of the call's.
				rep.Kept = append(rep.Kept, fmt.Sprintf("%s: %v", call.rec.Nonce, r.err))
				continue
			}
			errs = append(errs, fmt.Errorf("listing the containers of dead fork calls: %w", r.err))
			continue
		}
		u, err := c.rollback(ctx, call, r.rt, r.labelled)
		errs = append(errs, err)
		if u != nil {
			rep.Calls = append(rep.Calls, *u)
		}
	}
	return rep, errors.Join(errs...)
}

// rollback undoes one claimed call, and keeps it as a tombstone for Linger,
// or hands it back to the next collector when something could not be undone.
func (c Collector) rollback(ctx context.Context, call *Call, rt Podman, labelled map[string]string) (*Undone, error) {
	rec := call.rec
	if !rec.RolledBack.IsZero() && time.Since(rec.RolledBack) > Linger {
		return nil, call.End()
	}
	u := &Undone{Nonce: rec.Nonce, Owner: rec.Owner}
	var errs []error
	for _, id := range callContainers(rec, labelled) {
		if err := rt.Remove(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("removing container %s of a dead fork call: %w", id, err))
			continue
		}
		u.Siblings = append(u.Siblings, id)
	}
	if rec.RolledBack.IsZero() {
		errs = append(errs, c.removeOwnFiles(rec, u))
	}
	if err := errors.Join(errs...); err != nil {
		return u, errors.Join(err, call.release())
	}
	if rec.RolledBack.IsZero() {
		call.rec.RolledBack = time.Now().UTC()
	} else if len(u.Siblings) == 0 {
		u = nil // a tombstone that found nothing new
	}
	return u, call.release()
}

// removeOwnFiles removes a dead call's capture and temporary directories.
func (c Collector) removeOwnFiles(rec Record, u *Undone) error {
	var errs []error
	if dir, err := c.Store.Resolve(rec.PlanDir); rec.PlanDir != "" && err == nil && dir == filepath.Clean(rec.PlanDir) {
		if err := c.Store.Remove(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing the capture of a dead fork call: %w", err))
		} else {
			u.PlanDir = dir
		}
	}
	root := c.TempDir
	if root == "" {
		root = c.Store.TempDir()
	}
	for _, dir := range rec.TempDirs {
		if isTempDir(root, dir) && ownDir(dir) {
			errs = append(errs, os.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}

// callContainers lists a call's containers: the IDs it recorded and those
// labelled with its nonce, each once.
func callContainers(rec Record, labelled map[string]string) []string {
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		if id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if rec.RolledBack.IsZero() {
		for _, id := range rec.Siblings {
			add(id)
		}
	}
	for id, nonce := range labelled {
		if nonce == rec.Nonce && rec.Nonce != "" {
			add(id)
		}
	}
	return ids
}

// PodmanCLI is Podman through its own command line, for callers without a
// connection to a service.
type PodmanCLI struct {
	// Path of podman itself, not the tclone wrapper in /usr/local/bin
	// (plan.Layout.Podman).
	Path string
}

func (p PodmanCLI) run(ctx context.Context, args ...string) ([]byte, error) {
	if p.Path == "" {
		return nil, errors.New("no path to Podman's CLI was given")
	}
	cmd := exec.CommandContext(ctx, p.Path, args...)
	cmd.Env = append(os.Environ(), "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", p.Path, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Labelled implements Podman.
func (p PodmanCLI) Labelled(ctx context.Context, key string) (map[string]string, error) {
	out, err := p.run(ctx, "ps", "--all", "--filter", "label="+key, "--format", "json")
	if err != nil {
		return nil, err
	}
	var list []struct {
		ID     string            `json:"Id"`
		Labels map[string]string `json:"Labels"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("decoding podman ps: %w", err)
	}
	m := map[string]string{}
	for _, c := range list {
		if v, ok := c.Labels[key]; ok {
			m[c.ID] = v
		}
	}
	return m, nil
}

// Remove implements Podman.
func (p PodmanCLI) Remove(ctx context.Context, id string) error {
	_, err := p.run(ctx, "rm", "--force", "--ignore", "--volumes", "--time", "0", id)
	return err
}

// removeDeadTemps removes the temporary files of record updates whose
// writer was killed between writing and renaming them. Under its own name
// a record is written by its owner alone (its PID and start time begin the
// name); a claimed one (NAME.json.claimed-by-PID-START) by its claimer.
func (d Dir) removeDeadTemps() {
	temps, _ := filepath.Glob(filepath.Join(d.Path, "*.json*.tmp*"))
	for _, path := range temps {
		name := filepath.Base(path)
		var o journal.Owner
		format := "%d-%d-"
		if _, claimer, ok := strings.Cut(name, journal.ClaimSep); ok {
			name, format = claimer, "%d-%d.tmp"
		}
		if _, err := fmt.Sscanf(name, format, &o.Pid, &o.StartTime); err == nil && !o.Alive() {
			os.Remove(path)
		}
	}
}

// CrictlCLI is a CRI runtime through cri-tools' crictl, for the calls of
// Kubernetes forks: its "containers" are the pods such a fork made.
type CrictlCLI struct {
	Endpoint string
	// Path of crictl; empty means crictl on PATH.
	Path string
}

func (c CrictlCLI) run(ctx context.Context, args ...string) ([]byte, error) {
	path := c.Path
	if path == "" {
		path = "crictl"
	}
	args = append([]string{"--runtime-endpoint", c.Endpoint}, args...)
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", path, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Labelled implements Podman, for pods.
func (c CrictlCLI) Labelled(ctx context.Context, key string) (map[string]string, error) {
	out, err := c.run(ctx, "pods", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			ID     string            `json:"id"`
			Labels map[string]string `json:"labels"`
		} `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("decoding crictl pods: %w", err)
	}
	m := map[string]string{}
	for _, p := range list.Items {
		if v, ok := p.Labels[key]; ok {
			m[p.ID] = v
		}
	}
	return m, nil
}

// Remove implements Podman: the pod is stopped (its network torn down) and
// removed with its containers. One already gone is not an error.
func (c CrictlCLI) Remove(ctx context.Context, id string) error {
	if _, err := c.run(ctx, "stopp", id); err != nil && !strings.Contains(err.Error(), "not found") {
		return err
	}
	if _, err := c.run(ctx, "rmp", "--force", id); err != nil && !strings.Contains(err.Error(), "not found") {
		return err
	}
	return nil
}
