package hostagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/errorhandling"

	"github.com/tclone/tclone/shim/podmanfork"
)

// RuntimeName is the name tclone is registered under in containers.conf.
const RuntimeName = "tclone"

// inspectSource checks that source is a running container run by tclone.
func inspectSource(ctx context.Context, source string) (*define.InspectContainerData, error) {
	if source == "" {
		return nil, podmanfork.WithKind(podmanfork.ErrInvalidOption, errors.New("no source container given: name the container to fork"))
	}
	data, err := containers.Inspect(ctx, source, nil)
	if err != nil {
		err = fmt.Errorf("cannot fork %s: %w", source, err)
		var model *errorhandling.ErrorModel
		if errors.As(err, &model) && model.ResponseCode == http.StatusNotFound {
			err = podmanfork.WithKind(podmanfork.ErrNoSuchSource, err)
		}
		return nil, err
	}
	runtime := data.OCIRuntime
	if runtime != RuntimeName && filepath.Base(runtime) != RuntimeName {
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("cannot fork %s: it was created with --runtime %s; only containers run by tclone can be forked, so recreate it with --runtime %s", data.Name, runtime, RuntimeName))
	}
	if data.State == nil {
		return nil, fmt.Errorf("cannot fork %s: Podman reports no state for it", data.Name)
	}
	switch {
	case data.State.Paused:
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("cannot fork %s: it is paused; unpause it first (podman unpause %s)", data.Name, data.Name))
	case !data.State.Running:
		return nil, podmanfork.WithKind(podmanfork.ErrConflict, fmt.Errorf("cannot fork %s: it is %s, and only a running container can be forked; start it first", data.Name, data.State.Status))
	}
	return data, nil
}

// namer gives the siblings their names: the ones the user chose, or
// <source>-fork-<n> with the lowest numbers free.
type namer struct {
	given []string
	base  string
	// taken are the names Podman's containers held when last listed, and
	// those handed out here.
	taken map[string]bool
	// chosen are the default names handed out, by sibling.
	chosen map[int]string
	list   func(context.Context) ([]string, error)
}

func newNamer(ctx context.Context, source string, opts podmanfork.Options) (*namer, error) {
	n := &namer{given: opts.Names, base: source, taken: map[string]bool{}, chosen: map[int]string{}, list: containerNames}
	if n.defaulted() {
		if err := n.learn(ctx); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *namer) defaulted() bool { return len(n.given) == 0 }

// name returns sibling i's name. A default name stays the same until a
// clash is reported for it.
func (n *namer) name(i int) string {
	if !n.defaulted() {
		return n.given[i]
	}
	if name, ok := n.chosen[i]; ok {
		return name
	}
	for k := 1; ; k++ {
		name := fmt.Sprintf("%s-fork-%d", n.base, k)
		if !n.taken[name] {
			n.taken[name] = true
			n.chosen[i] = name
			return name
		}
	}
}

// clash records that another container took sibling i's default name
// first, and learns the names held now, so the next name is free.
func (n *namer) clash(ctx context.Context, i int) error {
	delete(n.chosen, i)
	return n.learn(ctx)
}

func (n *namer) learn(ctx context.Context) error {
	names, err := n.list(ctx)
	if err != nil {
		return fmt.Errorf("listing containers to name the siblings: %w", err)
	}
	for _, name := range names {
		n.taken[name] = true
	}
	return nil
}

func containerNames(ctx context.Context) ([]string, error) {
	list, err := containers.List(ctx, new(containers.ListOptions).WithAll(true))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, c := range list {
		for _, name := range c.Names {
			names = append(names, strings.TrimPrefix(name, "/"))
		}
	}
	return names, nil
}
