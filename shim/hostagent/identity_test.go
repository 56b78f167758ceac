package hostagent

import (
	"strings"
	"testing"

	"github.com/containers/podman/v5/libpod/define"

	"github.com/tclone/tclone/runtime/forkopts"
)

func TestCheckIdentity(t *testing.T) {
	plain := &define.InspectContainerData{Name: "ws", HostConfig: &define.InspectContainerHostConfig{UTSMode: "private"}}
	hostUTS := &define.InspectContainerData{Name: "ws", HostConfig: &define.InspectContainerHostConfig{UTSMode: "host"}}
	mountedID := &define.InspectContainerData{Name: "ws", HostConfig: &define.InspectContainerHostConfig{},
		Mounts: []define.InspectMount{{Source: "/etc/machine-id", Destination: "/etc/machine-id"}}}

	if limits, err := checkIdentity(forkopts.IdentityUnique, plain); err != nil || len(limits) != 0 {
		t.Fatalf("a plain source: %v %v", limits, err)
	}
	for _, src := range []*define.InspectContainerData{hostUTS, mountedID} {
		_, err := checkIdentity(forkopts.IdentityUnique, src)
		if err == nil || !strings.Contains(err.Error(), "--identity best-effort") {
			t.Errorf("unique accepted a source whose identity cannot change: %v", err)
		}
		limits, err := checkIdentity(forkopts.IdentityBestEffort, src)
		if err != nil || len(limits) != 1 {
			t.Errorf("best-effort: %v %v", limits, err)
		}
	}
	if l := identityLimits(mountedID); !strings.Contains(l["machine_id"], "/etc/machine-id is mounted") {
		t.Errorf("limits %v", l)
	}
	if _, err := checkIdentity(forkopts.IdentityPreserve, hostUTS); err != nil {
		t.Errorf("preserve refused: %v", err)
	}
}

// A source sharing a PID namespace is refused, naming the mode, unless only
// its files are forked; one with its own is not.
func TestCheckOwnPIDNamespace(t *testing.T) {
	for mode, refused := range map[string]bool{"": false, "private": false, "host": true, "container:abc": true, "ns:/proc/1/ns/pid": true} {
		src := &define.InspectContainerData{Name: "ws", HostConfig: &define.InspectContainerHostConfig{PidMode: mode}}
		err := checkOwnPIDNamespace(src, false)
		if refused != (err != nil) || (refused && !strings.Contains(err.Error(), "--pid="+mode)) {
			t.Errorf("--pid=%q: %v", mode, err)
		}
		if err := checkOwnPIDNamespace(src, true); err != nil {
			t.Errorf("--pid=%q, files only: %v", mode, err)
		}
	}
	if err := checkOwnPIDNamespace(&define.InspectContainerData{Name: "ws"}, false); err != nil {
		t.Errorf("no host config: %v", err)
	}
}
