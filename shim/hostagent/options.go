package hostagent

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containers/podman/v5/pkg/specgenutil"

	"github.com/tclone/tclone/shim/podmanfork"
)

// Validate checks every option as a fork here would before doing anything:
// the client's checks, and the ports to publish.
func Validate(o podmanfork.Options) error { return normalize(&o) }

// normalize checks every option and fills defaults, as the client's
// Normalize, and reads the ports to publish with Podman's own parser. It
// runs before anything is asked of Podman, so a bad option never leaves
// anything behind.
func normalize(o *podmanfork.Options) error {
	if err := o.Normalize(); err != nil {
		return err
	}
	return checkPublish(o)
}

// checkPublish parses the ports with Podman's own parser (the one its
// restore uses), and refuses a fixed host port for several siblings: only
// the first could bind it.
func checkPublish(o *podmanfork.Options) error {
	for _, p := range o.Publish {
		mappings, err := specgenutil.CreatePortBindings([]string{p})
		if err != nil {
			return fmt.Errorf("invalid --publish %q: %w", p, err)
		}
		for _, m := range mappings {
			if o.Count > 1 && m.HostPort != 0 {
				return fmt.Errorf("--publish %q gives all %d siblings host port %d, which only one can hold; "+
					"leave the host port out (-p %d) so Podman picks one for each", p, o.Count, m.HostPort, m.ContainerPort)
			}
		}
	}
	return nil
}

var hostnameBad = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// hostnameFor turns a container name into a valid hostname.
func hostnameFor(name string) string {
	h := strings.Trim(hostnameBad.ReplaceAllString(name, "-"), "-")
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-")
	}
	if h == "" {
		h = "fork"
	}
	return h
}
