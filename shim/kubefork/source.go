package kubefork

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// found is a running container of a ready pod, as the CRI describes them.
type found struct {
	// pods are the namespace's pods when it was found.
	pods []podItem
	pod  podItem
	ctr  containerItem
	ci   *containerInspect
	pi   *podInspect
}

// describe is the container and its pod as a Pod.
func (s *found) describe(namespace string) Pod {
	hostname, _ := s.pi.Info.Config["hostname"].(string)
	return Pod{Name: s.pod.Metadata.Name, Namespace: namespace, PodID: s.pod.ID, Container: s.ctr.Metadata.Name, ContainerID: s.ctr.ID,
		Hostname: hostname, IP: s.pi.Status.Network.IP}
}

// findContainer resolves target ("POD/CONTAINER", or "POD" for a pod with
// one running container) in namespace ns to a running container of a ready
// pod on this node, for verb (what the caller does with it: "fork").
func (c crictl) findContainer(ctx context.Context, ns, target, verb string) (*found, error) {
	podName, ctrName, _ := strings.Cut(target, "/")
	if podName == "" {
		return nil, fmt.Errorf("no pod given: %s POD/CONTAINER (or POD, for a pod with one container)", verb)
	}
	// The node's containers are listed with its pods, at once.
	var ctrs []containerItem
	listed := make(chan error, 1)
	go func() {
		var err error
		ctrs, err = c.containers(ctx, "")
		listed <- err
	}()
	pods, err := c.pods(ctx, ns)
	if err := errors.Join(err, <-listed); err != nil {
		return nil, err
	}
	var pod *podItem
	for i := range pods {
		p := &pods[i]
		if p.Metadata.Name == podName && p.State == "SANDBOX_READY" && (pod == nil || p.Metadata.Attempt > pod.Metadata.Attempt) {
			pod = p
		}
	}
	if pod == nil {
		return nil, fmt.Errorf("no ready pod %s in namespace %s on this node (crictl pods --namespace %s lists them)", podName, ns, ns)
	}
	var running []containerItem
	for _, ctr := range ctrs {
		if ctr.PodSandboxID == pod.ID && ctr.State == "CONTAINER_RUNNING" && (ctrName == "" || ctr.Metadata.Name == ctrName) {
			running = append(running, ctr)
		}
	}
	switch {
	case len(running) == 0 && ctrName != "":
		return nil, fmt.Errorf("pod %s has no running container %s", podName, ctrName)
	case len(running) == 0:
		return nil, fmt.Errorf("pod %s has no running container", podName)
	case len(running) > 1:
		return nil, fmt.Errorf("pod %s runs %d containers: name the one to %s, %s/CONTAINER", podName, len(running), verb, podName)
	}
	ci, pi, err := c.inspect(ctx, running[0].ID, pod.ID)
	if err != nil {
		return nil, err
	}
	return &found{pods: pods, pod: *pod, ctr: running[0], ci: ci, pi: pi}, nil
}

// inspect reads a container's and its pod's CRI status and configuration,
// both at once.
func (c crictl) inspect(ctx context.Context, ctrID, podID string) (*containerInspect, *podInspect, error) {
	var ci containerInspect
	var pi podInspect
	podErr := make(chan error, 1)
	go func() { podErr <- c.json(ctx, &pi, "inspectp", "-o", "json", podID) }()
	err := c.json(ctx, &ci, "inspect", "-o", "json", ctrID)
	if err := errors.Join(err, <-podErr); err != nil {
		return nil, nil, err
	}
	return &ci, &pi, nil
}
