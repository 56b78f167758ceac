package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
)

// logToStderr is false when --log sends the log to a file.
var logToStderr = true

// configureLogging sends logrus to --log in --log-format. Podman and conmon
// read the runtime's log file for the error of a failed call, and expect one
// JSON object per line with "level" and "msg" when they ask for json.
func configureLogging(c *cli.Context) error {
	// crun's and Podman's spellings: --debug, or --log-level debug.
	if c.Bool("debug") || c.String("log-level") == "debug" {
		logrus.SetLevel(logrus.DebugLevel)
	}
	switch c.String("log-format") {
	case "", "text":
		logrus.SetFormatter(&logrus.TextFormatter{DisableColors: true})
	case "json":
		logrus.SetFormatter(&logrus.JSONFormatter{})
	default:
		return fmt.Errorf("unknown --log-format %q (use text or json)", c.String("log-format"))
	}
	dest := c.String("log")
	if dest == "" {
		return nil
	}
	if strings.HasPrefix(dest, "journald:") || strings.HasPrefix(dest, "syslog:") {
		// crun itself handles these; tclone's own messages stay on stderr.
		return nil
	}
	path := strings.TrimPrefix(dest, "file:")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_SYNC, 0o640)
	if err != nil {
		return fmt.Errorf("opening log file %s: %w", path, err)
	}
	logrus.SetOutput(f)
	logToStderr = false
	return nil
}

// exitCoder is an error that carries a process exit status.
type exitCoder interface{ ExitCode() int }

// fatal is the one way tclone fails: the error goes to the log (as JSON
// when asked), to stderr if the log is elsewhere, and the exit status is
// non-zero.
func fatal(err error) {
	logrus.Error(err.Error())
	if !logToStderr {
		fmt.Fprintln(os.Stderr, err)
	}
	code := 1
	var ec exitCoder
	if errors.As(err, &ec) && ec.ExitCode() > 0 {
		code = ec.ExitCode()
	}
	os.Exit(code)
}
