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
		Flags: slices.Concat(kubeNodeFlags("the pod's Kubernetes namespace; the siblings go there too"), []cli.Flag{
			&cli.IntFlag{Name: "count", Value: 1, Usage: fmt.Sprintf("how many sibling pods (1..%d), all or nothing", kubefork.MaxCount)},
			&cli.StringFlag{Name: "name", Usage: "the sibling pod's name (with --count N: NAME-1..NAME-N); default POD-fork-<n>, the lowest free"},
			&cli.DurationFlag{Name: "ready-timeout", Value: kubeReadyTimeout, Usage: "how long each sibling's pod, restore and start may take"},
			&cli.StringFlag{Name: "format", Usage: "json: print the fork's result as JSON (timings, the pods and their IPs) instead of the pod names"},
		}, forkflags.Capture(), []cli.Flag{forkflags.MemoryFlag(), forkflags.Timeout()}),
		Action: kubeFork,
	}, {
		Name:  "checkpoint",
		Usage: "checkpoint a pod's running container into a checkpoint image, for new pods on any node",
		Description: `Checkpoints the running container CONTAINER of pod POD (POD alone for a pod
with one container) through the CRI runtime at --runtime-endpoint, as the
kubelet's checkpoint API does (a portable CRIU checkpoint; the container is
paused for the whole call, and runs on), and writes the CRI's archive as an
OCI checkpoint image NAME in the node's containerd (namespace k8s.io,
through ctr): one layer of the archive's files, annotated for containerd's
CRI (org.criu.checkpoint.container.name). With --push, the image goes to
its registry too (credentials are not passed: a registry that asks for
them needs another client). A container created with the image as its image,
in a new pod on any node that can pull it, starts restored from the
checkpoint. All or nothing: a failure leaves no image. Runs on the node, as
root, with crictl and ctr.`,
		ArgsUsage: "POD[/CONTAINER]",
		Flags: slices.Concat(kubeNodeFlags("the pod's Kubernetes namespace"), []cli.Flag{
			&cli.StringFlag{Name: "image", Required: true, Usage: "the checkpoint image's name, NAME[:TAG] (:latest when no tag is given); it must not exist on the node"},
			&cli.BoolFlag{Name: "push", Usage: "push the image to its registry"},
			&cli.BoolFlag{Name: "tls-verify", Value: true, Usage: "--tls-verify=false pushes over plain HTTP (a registry on loopback)"},
			&cli.StringFlag{Name: "hosts-dir", Usage: "containerd's registry configuration directory for the push (hosts.toml per registry; /etc/containerd/certs.d on a node that uses one)"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "how long the CRI's checkpoint call may take"},
			&cli.StringFlag{Name: "format", Usage: "json: print the result as JSON (the image's name, digest and size, and timings) instead of the image's name"},
		}),
		Action: kubeCheckpoint,
	}},
}

// kubeNodeFlags are the flags of the node's CRI and its clients, which
// every kube command takes (kubeNode reads them).
func kubeNodeFlags(namespaceUsage string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "default", Usage: namespaceUsage},
		&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r"}, EnvVars: []string{"CONTAINER_RUNTIME_ENDPOINT"},
			Value: "unix:///run/containerd/containerd.sock", Usage: "the CRI socket, containerd's (crictl's --runtime-endpoint)"},
		&cli.StringFlag{Name: "crictl", Value: "crictl", Usage: "cri-tools' crictl"},
		&cli.StringFlag{Name: "ctr", Value: "ctr", Usage: "containerd's ctr (it resumes a container the CRI's checkpoint call left paused, and imports and pushes images)"},
	}
}

func kubeNode(c *cli.Context) kubefork.Node {
	return kubefork.Node{Namespace: c.String("namespace"), Crictl: c.String("crictl"), Ctr: c.String("ctr"), Endpoint: c.String("runtime-endpoint")}
}

func kubeCheckpoint(c *cli.Context) error {
	target, err := oneArg(c, "POD[/CONTAINER]")
	if err != nil {
		return err
	}
	if format := c.String("format"); format != "" && format != "json" {
		return fmt.Errorf("--format %s: only json", format)
	}
	ctx, stop := signalContext(c.Context)
	defer stop()
	res, err := kubefork.CheckpointImage(ctx, target, kubefork.ImageOptions{
		Node: kubeNode(c), Image: c.String("image"), Push: c.Bool("push"), PlainHTTP: !c.Bool("tls-verify"),
		HostsDir: c.String("hosts-dir"), Timeout: c.Duration("timeout"),
		Store: plan.Store{Layout: hostlayout.Of(c)},
	})
	if err != nil {
		return err
	}
	if c.String("format") == "json" {
		return printJSON(res)
	}
	fmt.Fprintln(os.Stdout, res.Image.Name)
	return nil
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
		Node: kubeNode(c), Count: c.Int("count"), Name: c.String("name"), Fork: f,
		ReadyTimeout: c.Duration("ready-timeout"),
		Store:        plan.Store{Layout: hostlayout.Of(c)},
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
