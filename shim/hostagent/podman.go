package hostagent

import (
	"context"

	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/tclone/tclone/runtime/calls"
)

// bindingsPodman is calls.Podman through the bindings: the context given to
// each method must hold the connection (bindings.NewConnection).
type bindingsPodman struct{}

var _ calls.Podman = bindingsPodman{}

// Labelled implements calls.Podman.
func (bindingsPodman) Labelled(ctx context.Context, key string) (map[string]string, error) {
	list, err := containers.List(ctx, new(containers.ListOptions).WithAll(true).
		WithFilters(map[string][]string{"label": {key}}))
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, c := range list {
		if v, ok := c.Labels[key]; ok {
			m[c.ID] = v
		}
	}
	return m, nil
}

// Remove implements calls.Podman.
func (bindingsPodman) Remove(ctx context.Context, id string) error {
	_, err := containers.Remove(ctx, id, new(containers.RemoveOptions).WithForce(true).WithIgnore(true).WithTimeout(0).WithVolumes(true))
	return err
}
