package podmanfork

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"
)

// RuntimeName is the name tclone is registered under in containers.conf.
const RuntimeName = "tclone"

// inspectSource checks that source is a running container run by tclone.
func inspectSource(ctx context.Context, source string) (*define.InspectContainerData, error) {
	if source == "" {
		return nil, fmt.Errorf("no source container given")
	}
	data, err := containers.Inspect(ctx, source, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot fork %s: %w", source, err)
	}
	runtime := data.OCIRuntime
	if runtime != RuntimeName && filepath.Base(runtime) != RuntimeName {
		return nil, fmt.Errorf("cannot fork %s: it was created with --runtime %s; only containers run by tclone can be forked, so recreate it with --runtime %s", data.Name, runtime, RuntimeName)
	}
	if data.State == nil {
		return nil, fmt.Errorf("cannot fork %s: Podman reports no state for it", data.Name)
	}
	switch {
	case data.State.Paused:
		return nil, fmt.Errorf("cannot fork %s: it is paused; unpause it first (podman unpause %s)", data.Name, data.Name)
	case !data.State.Running:
		return nil, fmt.Errorf("cannot fork %s: it is %s, and only a running container can be forked; start it first", data.Name, data.State.Status)
	}
	return data, nil
}

// siblingNames returns the names of the siblings to make: the given ones, or
// <source>-fork-<n> with the lowest free numbers.
func siblingNames(ctx context.Context, source string, opts Options) ([]string, error) {
	if len(opts.Names) > 0 {
		return opts.Names, nil
	}
	list, err := containers.List(ctx, new(containers.ListOptions).WithAll(true))
	if err != nil {
		return nil, fmt.Errorf("listing containers to name the siblings: %w", err)
	}
	taken := map[string]bool{}
	for _, c := range list {
		for _, n := range c.Names {
			taken[strings.TrimPrefix(n, "/")] = true
		}
	}
	var names []string
	for n := 1; len(names) < opts.Count; n++ {
		name := fmt.Sprintf("%s-fork-%d", source, n)
		if !taken[name] {
			names = append(names, name)
		}
	}
	return names, nil
}
