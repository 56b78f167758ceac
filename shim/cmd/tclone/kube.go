package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
	"github.com/tclone/tclone/shim/forkflags"
	"github.com/tclone/tclone/shim/kubefork"
)

var kubeCommand = &cli.Command{
	Name:  "kube",
	Usage: "fork containers of Kubernetes pods through the node's CRI (containerd)",
	Subcommands: []*cli.Command{{
		Name:  "fork",
		Usage: "fork a pod's running container into new pods on this node",
		Description: `Forks the running container CONTAINER of pod POD (POD alone for a pod with one
container) into --count new pods on this node, through the CRI runtime at
--runtime-endpoint: the CRI checkpoints the container (tclone, its runtime
class's handler, captures a fork plan; the container is paused only for the
capture), then each sibling pod is run from the pod's own configuration with
its own name, UID and hostname (its name), and its container restored from
the checkpoint into it, with its own IP. All or nothing: a fork that fails
removes the pods it made. Runs on the node, as root, with crictl.`,
		ArgsUsage: "POD[/CONTAINER]",
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "default", Usage: "the pod's Kubernetes namespace; the siblings go there too"},
			&cli.IntFlag{Name: "count", Value: 1, Usage: fmt.Sprintf("how many sibling pods (1..%d), all or nothing", kubefork.MaxCount)},
			&cli.StringFlag{Name: "name", Usage: "the sibling pod's name (with --count N: NAME-1..NAME-N); default POD-fork-<n>, the lowest free"},
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r"}, EnvVars: []string{"CONTAINER_RUNTIME_ENDPOINT"},
				Value: "unix:///run/containerd/containerd.sock", Usage: "the CRI socket (crictl's --runtime-endpoint)"},
			&cli.StringFlag{Name: "crictl", Value: "crictl", Usage: "cri-tools' crictl"},
			&cli.DurationFlag{Name: "ready-timeout", Value: kubeReadyTimeout, Usage: "how long each sibling's pod, restore and start may take"},
			&cli.StringFlag{Name: "format", Usage: "json: print the fork's result as JSON (timings, the pods and their IPs) instead of the pod names"},
		}, forkflags.Capture(), []cli.Flag{forkflags.MemoryFlag(), forkflags.Timeout()}),
		Action: kubeFork,
	}},
}

const kubeReadyTimeout = 2 * time.Minute

func kubeFork(c *cli.Context) error {
	target, err := oneArg(c, "POD[/CONTAINER]")
	if err != nil {
		return err
	}
	f, err := forkflags.Read(c)
	if err != nil {
		return err
	}
	if f.TCP == forkopts.TCPKeep {
		return errors.New("--tcp-established: a sibling pod has its own address, and copies of the source's connections would carry the source's address and sequence numbers to its peers; siblings' copies are closed (--tcp-close)")
	}
	if format := c.String("format"); format != "" && format != "json" {
		return fmt.Errorf("--format %s: only json", format)
	}
	ctx, stop := signalContext(c.Context)
	defer stop()
	res, err := kubefork.Fork(ctx, target, kubefork.Options{
		Namespace: c.String("namespace"), Count: c.Int("count"), Name: c.String("name"), Fork: f,
		ReadyTimeout: c.Duration("ready-timeout"), Crictl: c.String("crictl"), Endpoint: c.String("runtime-endpoint"),
		Store: plan.Store{Layout: hostlayout.Of(c)},
	})
	if err != nil {
		return err
	}
	if c.String("format") == "json" {
		return printJSON(res)
	}
	for _, s := range res.Siblings {
		fmt.Fprintln(os.Stdout, s.Name)
	}
	return nil
}
