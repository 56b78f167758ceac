package kubefork

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
)

// crictl runs cri-tools' crictl against one CRI endpoint: the client every
// CRI runtime (containerd, CRI-O) answers, and the one a cluster's operator
// already has on each node.
type crictl struct {
	path     string
	endpoint string
}

// CRIError is a crictl command that failed, with what it said.
type CRIError struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *CRIError) Error() string {
	msg := lastLine(e.Stderr)
	if msg == "" {
		msg = e.Err.Error()
	}
	return fmt.Sprintf("crictl %s: %s", strings.Join(e.Args, " "), msg)
}

func (e *CRIError) Unwrap() error { return e.Err }

// lastLine is crictl's message without its log prefix: crictl prints
// warnings first (a missing /etc/crictl.yaml) and the fatal line last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if i := strings.Index(l, `msg="`); i >= 0 {
			l = strings.TrimSuffix(l[i+len(`msg="`):], `"`)
			l = strings.ReplaceAll(l, `\"`, `"`)
		}
		return l
	}
	return ""
}

func (c crictl) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := c.command(ctx, args...)
	// A crictl outlives a fork client killed with SIGKILL otherwise, and
	// could make a pod after the client's rollback looked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return c.output(cmd, args)
}

// runToEnd runs a crictl that neither ctx nor the client's death stops:
// for the checkpoint, which containerd brackets with a pause and a resume
// of the source, and whose resume it skips when the call is cancelled
// (the source would stay frozen). The caller stops the capture through
// tclone instead, which ends the call at once.
func (c crictl) runToEnd(args ...string) ([]byte, error) {
	return c.output(c.command(context.Background(), args...), args)
}

func (c crictl) command(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--runtime-endpoint", c.endpoint, "--image-endpoint", c.endpoint}, args...)
	return exec.CommandContext(ctx, c.path, full...)
}

func (c crictl) output(cmd *exec.Cmd, args []string) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, &CRIError{Args: args, Stderr: errb.String(), Err: err}
	}
	return out.Bytes(), nil
}

func (c crictl) json(ctx context.Context, v any, args ...string) error {
	out, err := c.run(ctx, args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("reading crictl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// podMeta is a pod sandbox's CRI metadata.
type podMeta struct {
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Attempt   uint32 `json:"attempt"`
}

type podItem struct {
	ID             string            `json:"id"`
	Metadata       podMeta           `json:"metadata"`
	State          string            `json:"state"`
	Labels         map[string]string `json:"labels"`
	RuntimeHandler string            `json:"runtimeHandler"`
}

// pods lists the pods of namespace ns (all namespaces when empty).
func (c crictl) pods(ctx context.Context, ns string) ([]podItem, error) {
	var out struct {
		Items []podItem `json:"items"`
	}
	args := []string{"pods", "-o", "json"}
	if ns != "" {
		args = append(args, "--namespace", ns)
	}
	return out.Items, c.json(ctx, &out, args...)
}

type containerItem struct {
	ID           string `json:"id"`
	PodSandboxID string `json:"podSandboxId"`
	Metadata     struct {
		Name string `json:"name"`
	} `json:"metadata"`
	State string `json:"state"`
}

// containers lists the containers of pod (of every pod when empty).
func (c crictl) containers(ctx context.Context, pod string) ([]containerItem, error) {
	var out struct {
		Containers []containerItem `json:"containers"`
	}
	args := []string{"ps", "-a", "-o", "json"}
	if pod != "" {
		args = append(args, "--pod", pod)
	}
	return out.Containers, c.json(ctx, &out, args...)
}

// podInspect is what `crictl inspectp` gives of a pod: the configuration
// it was run with (as the kubelet gave it) and its address.
type podInspect struct {
	Status struct {
		State   string `json:"state"`
		Network struct {
			IP string `json:"ip"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		Config         map[string]any `json:"config"`
		RuntimeHandler string         `json:"runtimeHandler"`
	} `json:"info"`
}

// containerInspect is what `crictl inspect` gives of a container.
type containerInspect struct {
	Status struct {
		State string `json:"state"`
	} `json:"status"`
	Info struct {
		Config         map[string]any `json:"config"`
		RuntimeType    string         `json:"runtimeType"`
		RuntimeOptions struct {
			BinaryName string `json:"binary_name"`
		} `json:"runtimeOptions"`
	} `json:"info"`
}

// imageExists reports whether the CRI has image name.
func (c crictl) imageExists(ctx context.Context, name string) (bool, error) {
	_, err := c.run(ctx, "inspecti", name)
	var ce *CRIError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ce) && strings.Contains(strings.ToLower(ce.Stderr), "no such image"):
		return false, nil
	}
	return false, fmt.Errorf("asking the CRI whether image %s exists: %w", name, err)
}
