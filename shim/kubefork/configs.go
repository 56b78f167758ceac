package kubefork

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// Labels a fork puts on each sibling pod and container it makes.
const (
	// LabelForkedFrom is the source container's ID.
	LabelForkedFrom = "io.tclone.forked-from"
	// LabelCall is the fork call's nonce: a rollback finds by it what the
	// call made, never by name.
	LabelCall = "io.tclone.fork-call"
)

// The labels the kubelet puts on a pod sandbox and its containers that
// name the pod; a sibling's name them anew.
const (
	kubePodName = "io.kubernetes.pod.name"
	kubePodUID  = "io.kubernetes.pod.uid"
)

// sibling is one pod a fork makes: its name and UID.
type sibling struct {
	name, uid string
}

// siblingPodConfig is the CRI PodSandboxConfig of a sibling, from the
// source pod's (as `crictl inspectp` gives it): the same namespace, DNS,
// security and resources, with the sibling's own name, UID and hostname,
// its own log directory, the fork's labels, and no host ports (those stay
// with the source).
func siblingPodConfig(src map[string]any, sib sibling, sourceID, call string) (map[string]any, error) {
	cfg, err := deepCopy(src)
	if err != nil {
		return nil, err
	}
	meta, _ := cfg["metadata"].(map[string]any)
	if meta == nil {
		return nil, fmt.Errorf("the source pod's configuration has no metadata")
	}
	ns, _ := meta["namespace"].(string)
	meta["name"], meta["uid"], meta["attempt"] = sib.name, sib.uid, 0
	cfg["hostname"] = sib.name
	delete(cfg, "port_mappings")
	if dir, _ := cfg["log_directory"].(string); dir != "" {
		// The kubelet's layout: /var/log/pods/<namespace>_<name>_<uid>.
		cfg["log_directory"] = filepath.Join(filepath.Dir(dir), ns+"_"+sib.name+"_"+sib.uid)
	}
	cfg["labels"] = forkLabels(cfg["labels"], sib, sourceID, call)
	return cfg, nil
}

// siblingContainerConfig is the CRI ContainerConfig of the sibling's
// container: the source's (as `crictl inspect` gives it), its image the
// fork's checkpoint archive, which containerd restores from.
func siblingContainerConfig(src map[string]any, archive string, sib sibling, sourceID, call string) (map[string]any, error) {
	cfg, err := deepCopy(src)
	if err != nil {
		return nil, err
	}
	if _, ok := cfg["metadata"].(map[string]any); !ok {
		return nil, fmt.Errorf("the source container's configuration has no metadata")
	}
	cfg["image"] = map[string]any{"image": archive}
	cfg["labels"] = forkLabels(cfg["labels"], sib, sourceID, call)
	return cfg, nil
}

// forkLabels is labels (a CRI labels map, or nil) with the fork's labels
// and, where the kubelet put them, the sibling pod's name and UID.
func forkLabels(labels any, sib sibling, sourceID, call string) map[string]any {
	out := map[string]any{}
	if m, ok := labels.(map[string]any); ok {
		for k, v := range m {
			out[k] = v
		}
	}
	if _, ok := out[kubePodName]; ok {
		out[kubePodName] = sib.name
	}
	if _, ok := out[kubePodUID]; ok {
		out[kubePodUID] = sib.uid
	}
	out[LabelForkedFrom] = sourceID
	out[LabelCall] = call
	return out
}

func deepCopy(m map[string]any) (map[string]any, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, json.Unmarshal(b, &out)
}

// siblingNames picks count names NAME-1..NAME-count for explicit names, or
// SOURCE-fork-<n> with the lowest n no pod of the namespace has.
func siblingNames(source, name string, count int, taken map[string]bool) ([]string, error) {
	var out []string
	if name != "" {
		for i := 1; i <= count; i++ {
			n := name
			if count > 1 {
				n = fmt.Sprintf("%s-%d", name, i)
			}
			if taken[n] {
				return nil, fmt.Errorf("a pod named %s exists in this namespace: choose another --name", n)
			}
			out = append(out, n)
		}
		return out, nil
	}
	for i := 1; len(out) < count; i++ {
		n := fmt.Sprintf("%s-fork-%d", source, i)
		if !taken[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

// checkName applies the Kubernetes rule for a pod name (a DNS subdomain,
// at most 63 characters here, since it is the sibling's hostname too).
func checkName(n string) error {
	if n == "" || len(n) > 63 {
		return fmt.Errorf("pod name %q: 1 to 63 characters, as a hostname", n)
	}
	for i, r := range n {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || (r == '-' || r == '.') && i > 0 && i < len(n)-1
		if !ok {
			return fmt.Errorf("pod name %q: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (Kubernetes' rule)", n)
		}
	}
	if strings.Contains(n, "..") {
		return fmt.Errorf("pod name %q: no empty label", n)
	}
	return nil
}
