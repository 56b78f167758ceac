package hostagent

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containers/podman/v5/pkg/bindings/system"
)

// checkService verifies that the Podman service restores with tclone. A
// Podman service creates containers from an imported checkpoint with its
// default runtime, whatever runtime the checkpoint came from, so siblings
// go through tclone only when tclone is that default.
func checkService(ctx context.Context) error {
	info, err := system.Info(ctx, nil)
	if err != nil {
		return fmt.Errorf("asking the Podman service for its configuration: %w", err)
	}
	name := info.Host.OCIRuntime.Name
	if name == RuntimeName || filepath.Base(info.Host.OCIRuntime.Path) == RuntimeName {
		return nil
	}
	return fmt.Errorf("the Podman service's default OCI runtime is %s, so it would restore siblings without tclone; "+
		"make tclone the default (hack/install.sh does: [engine] runtime = \"tclone\" in containers.conf), "+
		"or start the service as `podman --runtime tclone system service`", name)
}
