package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/ksm"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
)

// delegated lists the verbs tclone passes to crun untouched. Their flags are
// crun's; tclone does not parse them, so every flag crun has (and any it
// gains) passes through, and `tclone VERB --help` shows crun's help.
var delegated = []struct{ name, usage string }{
	{"create", "create a container"},
	{"start", "start a created container"},
	{"run", "create and start a container"},
	{"exec", "run a process in a running container"},
	{"state", "print a container's state"},
	{"list", "list known containers"},
	{"kill", "send a signal to a container's init process"},
	{"delete", "remove a container"},
	{"pause", "pause all processes of a container"},
	{"resume", "resume a paused container"},
	{"ps", "list the processes of a container"},
	{"update", "update a container's resource limits"},
	{"spec", "generate a configuration file"},
	{"features", "print the features crun supports"},
	{"mounts", "manage mounts of a running container"},
}

func delegatedCommands() []*cli.Command {
	cmds := make([]*cli.Command, 0, len(delegated))
	for _, d := range delegated {
		verb := d.name
		cmds = append(cmds, &cli.Command{
			Name:            verb,
			Usage:           d.usage + " (crun)",
			SkipFlagParsing: true,
			HideHelp:        true,
			Action: func(c *cli.Context) error {
				rt, err := findCrun(c)
				if err != nil {
					return err
				}
				if verb == "create" || verb == "run" {
					if err := markIfAsked(c.Args().Slice()); err != nil {
						return err
					}
				}
				if verb == "pause" {
					if skip, err := forkOwnsPause(c); skip || err != nil {
						return err
					}
				}
				// exec: the caller's stdio, inherited descriptors
				// (--preserve-fds, console sockets), PID, signals and exit
				// status are crun's own from here on.
				return rt.Exec(verb, c.Args().Slice(), nil)
			},
		})
	}
	return cmds
}

// markIfAsked marks this process mergeable before it becomes crun, when the
// container's config asks for it (forkopts.AnnotationMerge): crun and the
// container's processes inherit the mark from their first instruction.
func markIfAsked(args []string) error {
	bundle := "."
	for i, a := range args {
		switch {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
	}
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil // crun says what is wrong with the bundle
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(data, &spec) != nil || spec.Annotations[forkopts.AnnotationMerge] != "true" {
		return nil
	}
	if err := ksm.Available(); err != nil {
		return fmt.Errorf("annotation %s=true: %w", forkopts.AnnotationMerge, err)
	}
	return ksm.MarkSelf()
}

// forkOwnsPause reports whether this pause is the one a fork's checkpoint
// caller makes around it (plan.Store.ClaimCallerPause): containerd's CRI
// checkpoint pauses the container first, and resumes it once it has
// archived its filesystem. The fork's capture holds the source itself, for
// its instant, and freezes it again when it is done, for that archive; so
// this pause leaves it running. The caller's resume thaws it (on a running
// container, when the capture failed, crun's resume does nothing).
func forkOwnsPause(c *cli.Context) (bool, error) {
	args := c.Args().Slice()
	if len(args) == 0 || strings.HasPrefix(args[len(args)-1], "-") {
		return false, nil // crun says what is missing
	}
	id := args[len(args)-1]
	claimed, err := plan.Store{Layout: hostlayout.Of(c)}.ClaimCallerPause(id)
	if err != nil {
		// An unreadable intent is no reason to refuse a pause: it is
		// made as asked.
		logrus.Warnf("pause of %s: %v", id, err)
		return false, nil
	}
	if claimed {
		logrus.Infof("pause of %s: its fork's capture holds it, for the capture only", id)
	}
	return claimed, nil
}
