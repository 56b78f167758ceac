package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/plan"
)

var errReached = errors.New("reached Podman")

// Every bad flag is refused before a connection to Podman is made.
func TestRefusedBeforePodman(t *testing.T) {
	connectTo = func(context.Context, plan.Layout, target, bool) (context.Context, func(), error) {
		return nil, nil, errReached
	}
	defer func() { connectTo = connect }()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--count", "0"}, "--count 0: out of range"},
		{[]string{"--count", "33"}, "--count 33: out of range"},
		{[]string{"--ready-timeout", "0s"}, "--ready-timeout"},
		{[]string{"--ready", "bogus"}, "invalid readiness"},
		{[]string{"--identity", "clone"}, "identity"},
		{[]string{"--label", "novalue"}, "KEY=VALUE"},
		{[]string{"--name", "bad/x!"}, "names must match"},
		{[]string{"--name", "bad x"}, "names must match"},
		{[]string{"-p", "x"}, "--publish"},
		{[]string{"--count", "2", "-p", "8081:80"}, "host port"},
		{[]string{"--hook", " "}, "hook"},
		{[]string{"--format", "yaml"}, "--format"},
		{[]string{"--parallel", "0"}, "--parallel 0: out of range"},
		{[]string{"--parallel", "33"}, "--parallel 33: out of range"},
		{[]string{"--name", "a", "--name", "b", "--count", "3"}, "2 names for 3 siblings"},
		{[]string{"--url", "unix:///x", "--connection", "c"}, "give one"},
		{[]string{"--ssh-identity", "/k"}, "--ssh-identity is for an ssh://"},
		{[]string{"--memory", "fast"}, "memory mode"},
		{[]string{"--files-only", "--memory", "copy"}, "--files-only takes none"},
		{[]string{"--volume-mode", "move"}, "--volume-mode"},
		{[]string{"--volume-mode", "copy", "--volume-mode", "share"}, "both given"},
		{[]string{"src2"}, "exactly one SOURCE"},
		{[]string{""}, "exactly one SOURCE"},
	} {
		app := newApp(plan.LayoutUnder(t.TempDir()))
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		err := app.Run(append(append([]string{"podman-fork"}, c.args...), "src"))
		if c.args[0] == "" {
			err = app.Run([]string{"podman-fork", ""})
		}
		if err == nil || errors.Is(err, errReached) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	app := newApp(plan.LayoutUnder(t.TempDir()))
	if err := app.Run([]string{"podman-fork", "--count", "3", "--name", "ok", "-p", "80", "src"}); !errors.Is(err, errReached) {
		t.Errorf("good flags did not reach Podman: %v", err)
	}
}
