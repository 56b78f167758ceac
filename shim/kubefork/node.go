package kubefork

import (
	"errors"
	"strings"
)

// Node is the CRI runtime of the node tclone runs on, and the clients that
// talk to it: a fork and a checkpoint image both go through them.
type Node struct {
	// Namespace is the pod's Kubernetes namespace (default "default").
	Namespace string
	// Crictl is cri-tools' crictl and Ctr containerd's ctr (defaults:
	// found in PATH); Endpoint is the CRI socket both talk to
	// (unix:///run/containerd/containerd.sock for the node's containerd).
	Crictl, Ctr, Endpoint string
}

func (n *Node) defaults() error {
	if n.Namespace == "" {
		n.Namespace = "default"
	}
	if n.Crictl == "" {
		n.Crictl = "crictl"
	}
	if n.Ctr == "" {
		n.Ctr = "ctr"
	}
	if n.Endpoint == "" {
		return errors.New("no CRI endpoint: give --runtime-endpoint (unix:///run/containerd/containerd.sock for the node's containerd)")
	}
	return nil
}

func (n Node) cri() crictl { return crictl{path: n.Crictl, endpoint: n.Endpoint} }

// ctr is ctr on the node's containerd, reached through the CRI socket's
// path; false when the endpoint is not a unix socket.
func (n Node) ctr() (ctrTool, bool) {
	addr, ok := strings.CutPrefix(n.Endpoint, "unix://")
	return ctrTool{path: n.Ctr, address: addr}, ok
}
