package main

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/forkflags"
)

// parse runs args through a copy of cmd inside a real app, as main would,
// and returns the context its action received.
func parse(t *testing.T, cmd *cli.Command, args ...string) *cli.Context {
	t.Helper()
	var got *cli.Context
	c := *cmd
	c.Action = func(ctx *cli.Context) error { got = ctx; return nil }
	app := &cli.App{Name: "tclone", Commands: []*cli.Command{&c}}
	if err := app.Run(append([]string{"tclone", c.Name}, args...)); err != nil {
		t.Fatal(err)
	}
	if got == nil {
		t.Fatal("action not reached")
	}
	return got
}

// Podman's exact checkpoint argv (it repeats --leave-running) must reach
// crun with every option intact.
func TestCheckpointArgsRoundTrip(t *testing.T) {
	c := parse(t, checkpointCommand, "--image-path", "/b/checkpoint", "--work-path", "/b",
		"--leave-running", "--leave-running", "--tcp-established", "--file-locks", "--manage-cgroups-mode", "ignore", "ID")
	capture, err := forkflags.ReadCapture(c)
	if err != nil {
		t.Fatal(err)
	}
	got := crunCheckpointArgs(c, capture)
	want := []string{"--image-path", "/b/checkpoint", "--work-path", "/b", "--leave-running",
		"--tcp-established", "--file-locks", "--manage-cgroups-mode", "ignore"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if c.Args().First() != "ID" {
		t.Fatalf("container ID %q", c.Args().First())
	}
}

// Every restore flag reaches crun, except --tcp-close, which crun 1.21
// does not have: CRIU gets it from a configuration file instead.
func TestRestoreArgsRoundTrip(t *testing.T) {
	c := parse(t, restoreCommand, "--bundle", "/b", "--pid-file", "/p", "--detach",
		"--image-path", "/b/checkpoint", "--work-path", "/b", "--console-socket", "/s", "--tcp-close",
		"--lsm-profile", "apparmor:x", "ID")
	capture, err := forkflags.ReadCapture(c)
	if err != nil {
		t.Fatal(err)
	}
	got := crunRestoreArgs(c, capture)
	want := []string{"--bundle", "/b", "--image-path", "/b/checkpoint", "--work-path", "/b",
		"--detach", "--pid-file", "/p", "--console-socket", "/s", "--lsm-profile", "apparmor:x"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	env, cleanup, err := tcpCloseEnv(capture)
	if err != nil || len(env) != 1 {
		t.Fatalf("env %q, %v", env, err)
	}
	conf, _ := strings.CutPrefix(env[0], "CRIU_CONFIG_FILE=")
	if data, err := os.ReadFile(conf); err != nil || string(data) != "tcp-close\n" {
		t.Fatalf("CRIU configuration %q: %q, %v", conf, data, err)
	}
	cleanup()
	if _, err := os.Stat(conf); err == nil {
		t.Error("the configuration outlived the restore")
	}
	c = parse(t, restoreCommand, "--tcp-established", "ID")
	if capture, _ := forkflags.ReadCapture(c); capture.TCP != forkopts.TCPKeep {
		t.Errorf("--tcp-established read as %q", capture.TCP)
	} else if env, _, _ := tcpCloseEnv(capture); len(env) != 0 {
		t.Errorf("a restore without --tcp-close got %q", env)
	}
}

func TestRestoreShortFlags(t *testing.T) {
	c := parse(t, restoreCommand, "-b", "/b", "-d", "ID")
	if c.String("bundle") != "/b" || !c.Bool("detach") {
		t.Fatalf("short flags not understood: %q %v", c.String("bundle"), c.Bool("detach"))
	}
}

func TestMaterializeRequestFromRestoreFlags(t *testing.T) {
	c := parse(t, restoreCommand, "--bundle", "/b", "--pid-file", "/p", "--detach", "--image-path", "/b/checkpoint",
		"--work-path", "/w", "--console-socket", "/s", "--tcp-close", "--memory", "copy", "ID")
	opts, _ := forkflags.Read(c)
	req := siblingRequest(c, "ID", "/run/tclone/plans/x", opts)
	if req.ID != "ID" || req.Plan != "/run/tclone/plans/x" || req.Bundle != "/b" || !req.Detach ||
		req.PidFile != "/p" || req.ConsoleSocket != "/s" || req.WorkPath != "/w" || req.TCP != forkopts.TCPClose ||
		req.Memory != forkopts.MemoryCopy {
		t.Fatalf("request %+v", req)
	}
	c = parse(t, restoreCommand, "--tcp-established", "--image-path", "/p", "ID")
	opts, _ = forkflags.Read(c)
	if req := siblingRequest(c, "ID", "/p", opts); req.TCP != forkopts.TCPKeep || req.Memory != "" {
		t.Fatalf("--tcp-established on a plan: %+v", req)
	}
	c = parse(t, restoreCommand, "--image-path", "/p", "ID")
	opts, _ = forkflags.Read(c)
	if req := siblingRequest(c, "ID", "/p", opts); req.TCP != "" {
		t.Fatalf("no TCP flag must leave the plan's policy: %+v", req)
	}
}

// Delegated verbs take crun's flags verbatim, unparsed.
func TestDelegatedVerbsSkipFlagParsing(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range delegatedCommands() {
		if !c.SkipFlagParsing {
			t.Errorf("%s parses flags; crun's flags would be rejected", c.Name)
		}
		seen[c.Name] = true
	}
	for _, verb := range []string{"create", "start", "run", "exec", "state", "list", "kill", "delete", "pause", "resume", "ps", "update", "spec", "features"} {
		if !seen[verb] {
			t.Errorf("verb %s is not delegated", verb)
		}
	}
}

func TestGlobalFlagsReachCrun(t *testing.T) {
	app := newApp(plan.LayoutUnder(t.TempDir()))
	var g crun.Global
	app.Before = nil
	app.Commands = []*cli.Command{{Name: "state", Action: func(c *cli.Context) error { g = globalOptions(c); return nil }}}
	if err := app.Run([]string{"tclone", "--root", "/r", "--log", "/l", "--log-format", "json", "--systemd-cgroup", "--debug", "--rootless", "false", "state"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"--debug", "--log=/l", "--log-format=json", "--root=/r", "--systemd-cgroup", "--rootless=false"}
	if got := g.Args(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
}

// `tclone service` runs tclone-service from beside tclone, and says how to
// mend a tclone installed without it.
func TestServiceBinaryMissing(t *testing.T) {
	_, err := serviceBinary()
	if err == nil || !strings.Contains(err.Error(), "tclone-service is missing beside") || !strings.Contains(err.Error(), "make install") {
		t.Fatalf("serviceBinary beside the test binary: %v, want it missing with advice", err)
	}
}

// containerd's runc v2 shim restores with go-runc's argv: -no-subreaper
// (one dash) is accepted and ignored, and the restore's flags reach crun
// as crun spells them.
func TestRuncRestoreArgv(t *testing.T) {
	c := parse(t, restoreCommand, "--image-path", "/var/lib/c/ctrd-restore/checkpoint", "--work-path", "/var/lib/c/work",
		"--detach", "--pid-file", "/run/b/init.pid", "-no-subreaper", "--bundle", "/run/b", "ID")
	if err := refuseRunc(c); err != nil {
		t.Fatalf("the shim's restore argv was refused: %v", err)
	}
	capture, err := forkflags.ReadCapture(c)
	if err != nil {
		t.Fatal(err)
	}
	got := []string(crunRestoreArgs(c, capture))
	want := []string{"--bundle", "/run/b", "--image-path", "/var/lib/c/ctrd-restore/checkpoint", "--work-path", "/var/lib/c/work", "--detach", "--pid-file", "/run/b/init.pid"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("crun restore args %q, want %q", got, want)
	}
}

// runc's flags that tclone cannot honour are refused by name, saying why;
// left unset or false, they change nothing.
func TestRuncFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  *cli.Command
		args []string
		flag string
	}{
		{restoreCommand, []string{"--no-pivot", "ID"}, "--no-pivot"},
		{restoreCommand, []string{"--empty-ns", "network", "ID"}, "--empty-ns"},
		{restoreCommand, []string{"--lazy-pages", "ID"}, "--lazy-pages"},
		{checkpointCommand, []string{"--page-server", "127.0.0.1:1", "ID"}, "--page-server"},
		{checkpointCommand, []string{"--status-fd", "3", "ID"}, "--status-fd"},
		{checkpointCommand, []string{"--empty-ns", "network", "ID"}, "--empty-ns"},
	} {
		err := refuseRunc(parse(t, tc.cmd, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.flag+" is runc's and not supported") {
			t.Errorf("%s %q: %v, want %s refused", tc.cmd.Name, tc.args, err, tc.flag)
		}
	}
	if err := refuseRunc(parse(t, restoreCommand, "--no-pivot=false", "ID")); err != nil {
		t.Errorf("--no-pivot=false refused: %v", err)
	}
}
