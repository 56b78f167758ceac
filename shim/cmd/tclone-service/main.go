// Command tclone-service is tclone's API service, which `tclone service`
// runs: Podman's libpod API with the fork and branch endpoints added. It is
// a binary of its own because it links Podman's client bindings, which
// would make every start of the runtime (each call Podman and conmon make)
// slower.
package main

import (
	"os"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/runtime/plan"
)

func main() {
	logrus.SetOutput(os.Stderr)
	if err := newApp(plan.HostLayout()).Run(os.Args); err != nil {
		logrus.Error(err.Error())
		os.Exit(1)
	}
}
