package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// ServiceBinary is the program `tclone service` runs, installed beside
// tclone: the service links Podman's client bindings, which the runtime
// does not carry.
const ServiceBinary = "tclone-service"

var serviceCommand = &cli.Command{
	Name:            "service",
	Usage:           "serve Podman's API with the fork and branch endpoints added, for REST clients local or remote (see 'tclone service --help')",
	SkipFlagParsing: true,
	HideHelp:        true,
	Action: func(c *cli.Context) error {
		bin, err := serviceBinary()
		if err != nil {
			return err
		}
		args := []string{ServiceBinary}
		if c.Bool("debug") {
			args = append(args, "--debug")
		}
		// --log, which configureLogging opened for tclone, becomes the
		// service's stderr, where it logs.
		if f, ok := logrus.StandardLogger().Out.(*os.File); ok && !logToStderr {
			if err := unix.Dup2(int(f.Fd()), 2); err != nil {
				return fmt.Errorf("sending the service's log to --log %s: %w", c.String("log"), err)
			}
		}
		// The service takes this process's place, PID included, so that a
		// pid file and systemd's socket activation (LISTEN_PID) still name
		// it.
		err = syscall.Exec(bin, append(args, c.Args().Slice()...), os.Environ())
		return fmt.Errorf("running %s: %w", bin, err)
	},
}

// serviceBinary finds tclone-service beside the running tclone.
func serviceBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", ServiceBinary, err)
	}
	bin := filepath.Join(filepath.Dir(self), ServiceBinary)
	if _, err := os.Stat(bin); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%s is missing beside %s: install tclone again (make install)", bin, self)
		}
		return "", err
	}
	return bin, nil
}
