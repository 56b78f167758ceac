package crun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Container states as crun reports them.
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusPaused  = "paused"
	StatusStopped = "stopped"
)

// State is crun's `state` output: the OCI state plus crun's rootfs field.
type State struct {
	ID          string            `json:"id"`
	Pid         int               `json:"pid"`
	Status      string            `json:"status"`
	Bundle      string            `json:"bundle"`
	Rootfs      string            `json:"rootfs"`
	Created     string            `json:"created"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ErrNotFound reports a container crun does not know.
var ErrNotFound = errors.New("container not found")

// State asks crun for a container's state.
func (r *Runtime) State(ctx context.Context, id string) (*State, error) {
	if _, err := os.Stat(filepath.Join(r.Global.StateRoot(), id)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("container %q: %w under %s", id, ErrNotFound, r.Global.StateRoot())
	}
	out, err := r.Output(ctx, "state", id)
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("decoding crun state of %q: %w", id, err)
	}
	return &st, nil
}

// Status holds the fields of crun's private status file that the OCI state
// does not expose but a checkpoint needs: the cgroup and the container's
// original stdio, which crun records at create time.
type Status struct {
	Pid                 int    `json:"pid"`
	CgroupPath          string `json:"cgroup-path"`
	Rootfs              string `json:"rootfs"`
	Bundle              string `json:"bundle"`
	SystemdCgroup       bool   `json:"systemd-cgroup"`
	ExternalDescriptors string `json:"external_descriptors"`
}

// ReadStatus reads crun's status file for id.
func (r *Runtime) ReadStatus(id string) (*Status, error) {
	p := filepath.Join(r.Global.StateRoot(), id, "status")
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading crun status of %q: %w", id, err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("decoding crun status %s: %w", p, err)
	}
	return &st, nil
}
