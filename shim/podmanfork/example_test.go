package podmanfork_test

import (
	"context"
	"fmt"
	"log"

	"github.com/containers/podman/v5/pkg/bindings"

	"github.com/tclone/tclone/shim/podmanfork"
)

// Fork a running workspace into two siblings that are ready once a command
// runs in them, from a CI job, through tclone's API service (`tclone
// service`; hack/tclone-service.sh start where there is no systemd). The
// same works over ssh://USER@HOST/run/tclone/tclone.sock with
// bindings.NewConnectionWithIdentity. It needs the service and a container
// "dev" running under tclone, so go test compiles it without running it;
// the integration tests TestRESTOverSSH and TestRESTConcurrentForks make
// the same calls against a live service.
func Example() {
	conn, err := bindings.NewConnection(context.Background(), "unix:///run/tclone/tclone.sock")
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
