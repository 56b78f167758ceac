package podmanfork_test

import (
	"context"
	"fmt"
	"log"

	"github.com/containers/podman/v5/pkg/bindings"

	"github.com/tclone/tclone/shim/podmanfork"
)

// Fork a running workspace into two siblings that are ready once a command
// runs in them, from a CI job on the Podman host. It needs a Podman service
// (hack/podman-service.sh start) and a container "dev" running under
// tclone, so go test compiles it without running it; the integration test
// TestGoClientOverREST makes the same calls against a live service.
func Example() {
	conn, err := bindings.NewConnection(context.Background(), "unix:///run/podman/podman.sock")
	if err != nil {
		log.Fatal(err)
	}
	siblings, err := podmanfork.Fork(conn, "dev", podmanfork.Options{
		Count:  2,
		Ready:  podmanfork.Ready{Kind: podmanfork.ReadyExec},
		Labels: map[string]string{"ci-job": "1234"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range siblings {
		fmt.Printf("%s %s %s first command after %.0f ms\n", s.Name, s.ID[:12], s.IP, s.FirstCommandMs)
	}
}
