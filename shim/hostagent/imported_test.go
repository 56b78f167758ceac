package hostagent

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

// A spec as Podman makes it for `podman run -v data:/data IMAGE`.
const plainSpec = `{"ociVersion":"1.0.0","process":{"args":["sh"],"capabilities":{"bounding":["CAP_CHOWN","CAP_KILL"],"effective":["CAP_CHOWN"]}},
"mounts":[{"destination":"/proc","type":"proc","source":"proc","options":["nosuid","noexec","nodev"]},
{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","strictatime","mode=755","size=65536k"]},
{"destination":"/sys","type":"sysfs","source":"sysfs","options":["nosuid","noexec","nodev","ro"]},
{"destination":"/dev/shm","type":"bind","source":"/var/lib/containers/storage/overlay-containers/x/userdata/shm","options":["bind"]},
{"destination":"/data","type":"bind","source":"/elsewhere/data/_data","options":["rbind"]}],
"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/run/netns/x"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"cgroup"}],
"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"},"cgroupsPath":"machine.slice:libpod:x","resources":{"devices":[{"allow":false,"access":"rwm"}]}},
"annotations":{"io.tclone.memory-merge":"true","run.oci.hooks.stdout":"/etc/x"}}`

// Exploit 2: the archive's configuration passed to Podman nearly
// untouched, so an archive could ask for a privileged container with /
// bind-mounted, or hooks run on this host.
func TestImportedConfigurationRefusesPrivileges(t *testing.T) {
	vols := map[string]string{"/data": "/var/lib/containers/storage/volumes/data/_data"}
	out, err := checkImportedSpec([]byte(plainSpec), vols)
	if err != nil {
		t.Fatalf("a plain container's spec was refused: %v", err)
	}
	var spec map[string]any
	json.Unmarshal(out, &spec)
	text := string(out)
	if !strings.Contains(text, vols["/data"]) || strings.Contains(text, "/elsewhere") || strings.Contains(text, "userdata/shm") ||
		strings.Contains(text, "run.oci.hooks") || strings.Contains(text, "/run/netns/x") || strings.Contains(text, "cgroupsPath") {
		t.Errorf("trimmed spec: %s", out)
	}
	for what, change := range map[string]func(string) string{
		"host root bind-mounted": func(s string) string {
			return strings.Replace(s, `"mounts":[`, `"mounts":[{"destination":"/host","type":"bind","source":"/","options":["rbind"]},`, 1)
		},
		"a prestart hook": func(s string) string {
			return strings.Replace(s, `"ociVersion":"1.0.0",`, `"ociVersion":"1.0.0","hooks":{"prestart":[{"path":"/bin/sh"}]},`, 1)
		},
		"CAP_SYS_ADMIN":      func(s string) string { return strings.Replace(s, `"CAP_KILL"`, `"CAP_SYS_ADMIN"`, 1) },
		"host PID namespace": func(s string) string { return strings.Replace(s, `{"type":"pid"},`, ``, 1) },
		"no seccomp": func(s string) string {
			return strings.Replace(s, `"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"},`, ``, 1)
		},
		"a device":         func(s string) string { return strings.Replace(s, `"allow":false`, `"allow":true`, 1) },
		"a user namespace": func(s string) string { return strings.Replace(s, `{"type":"cgroup"}`, `{"type":"user"}`, 1) },
		"a mount ns by path": func(s string) string {
			return strings.Replace(s, `{"type":"mount"}`, `{"type":"mount","path":"/proc/1/ns/mnt"}`, 1)
		},
		"an unknown volume": func(s string) string { return strings.Replace(s, `"destination":"/data"`, `"destination":"/other"`, 1) },
		"a non-namespaced sysctl": func(s string) string {
			return strings.Replace(s, `"seccomp":`, `"sysctl":{"kernel.core_pattern":"|/tmp/x"},"seccomp":`, 1)
		},
	} {
		if _, err := checkImportedSpec([]byte(change(plainSpec)), vols); !errors.Is(err, podmanfork.ErrInvalidOption) {
			t.Errorf("%s: %v, want a refusal", what, err)
		}
	}
	for what, cfg := range map[string]string{
		"privileged":                 `{"privileged":true}`,
		"another container's PID ns": `{"pidNsCtr":"abc"}`,
		"a timezone out of zoneinfo": `{"timezone":"../../etc/shadow"}`,
		"this host's secrets":        `{"secrets":[{"Name":"db-password"}]}`,
		"host network":               `{"networkMode":"host"}`,
	} {
		if _, err := checkImportedConfig([]byte(cfg)); !errors.Is(err, podmanfork.ErrInvalidOption) {
			t.Errorf("config with %s: %v, want a refusal", what, err)
		}
	}
	out, err = checkImportedConfig([]byte(`{"name":"x","staticDir":"/etc","ShmDir":"/etc","conmonPidFile":"/etc/shadow","pid_file":"/etc/passwd","lockID":3,"command":["sh"],"networkMode":"bridge","timezone":"Europe/Paris"}`))
	if err != nil || strings.Contains(string(out), "/etc") || !strings.Contains(string(out), "Europe/Paris") {
		t.Errorf("plain config: %s, %v", out, err)
	}
}

func TestLocalizeVolumes(t *testing.T) {
	uses := []podmanfork.VolumeUse{{Name: "data", Source: "/etc/cron.d/x/_data", Destination: "/data", Mode: podmanfork.VolumeCopy}}
	dirs, err := localizeVolumes(uses, nil, "/var/lib/containers/storage/volumes")
	if err != nil || dirs["/data"] != "/var/lib/containers/storage/volumes/data/_data" || uses[0].Source != dirs["/data"] {
		t.Fatalf("%v %v %+v", dirs, err, uses)
	}
	for _, u := range []podmanfork.VolumeUse{
		{Name: "prod-db", Source: "/x", Destination: "/db", Mode: podmanfork.VolumeShare},
		{Source: "/", Destination: "/host", Mode: podmanfork.VolumeBind},
		{Name: "../x", Destination: "/d", Mode: podmanfork.VolumeCopy},
	} {
		if _, err := localizeVolumes([]podmanfork.VolumeUse{u}, nil, "/v"); !errors.Is(err, podmanfork.ErrInvalidOption) {
			t.Errorf("%+v: %v, want a refusal", u, err)
		}
	}
}

// What Podman itself writes for a plain `podman run IMAGE sleep` (5.4, saved
// from `podman container checkpoint --export`) is what an imported branch
// of an ordinary container carries: it must pass, without the source host's
// paths, and with the user's settings kept.
func TestImportedPlainPodmanDumps(t *testing.T) {
	cfg, err := os.ReadFile("testdata/podman-5.4-config.dump")
	if err != nil {
		t.Fatal(err)
	}
	out, err := checkImportedConfig(cfg)
	if err != nil {
		t.Fatalf("Podman's own config.dump refused: %v", err)
	}
	if strings.Contains(string(out), "/var/lib/containers") || strings.Contains(string(out), "/run/containers") || strings.Contains(string(out), "libpod_parent") {
		t.Errorf("the source host's paths or cgroup kept: %s", out)
	}
	if !strings.Contains(string(out), `"command":["sleep","600"]`) || !strings.Contains(string(out), `"stopSignal":15`) {
		t.Errorf("the container's own settings lost: %s", out)
	}
	spec, err := os.ReadFile("testdata/podman-5.4-spec.dump")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkImportedSpec(spec, nil); err != nil {
		t.Fatalf("Podman's own spec.dump refused: %v", err)
	}
	// A user namespace is still refused.
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	m["idMappingsOptions"].(map[string]any)["UIDMap"] = []any{map[string]any{"container_id": 0, "host_id": 100000, "size": 65536}}
	mapped, _ := json.Marshal(m)
	if _, err := checkImportedConfig(mapped); !errors.Is(err, podmanfork.ErrInvalidOption) {
		t.Errorf("config with a UID mapping: %v, want a refusal", err)
	}
}

// An imported branch's archive, trimmed to what its start may use, keeps
// no plan reference of the source host's: the sibling's archive gets the
// reference to the plan made here (without it the runtime takes the
// restore for an ordinary checkpoint's).
func TestImportedArchiveGetsTheSiblingsReference(t *testing.T) {
	dir := t.TempDir()
	cfg, _ := os.ReadFile("testdata/podman-5.4-config.dump")
	spec, _ := os.ReadFile("testdata/podman-5.4-spec.dump")
	src := filepath.Join(dir, "src.tar")
	elsewhere := plan.Reference{PlanID: "theirs", PlanDir: "/run/tclone/plans/theirs"}
	writeTar(t, src, map[string]any{"checkpoint/" + plan.ReferenceFile: elsewhere},
		map[string]string{"config.dump": string(cfg), "spec.dump": string(spec), "checkpoint/inventory.img": "inv", "checkpoint/pages-1.img": "x"})
	trimmed := filepath.Join(dir, "trimmed.tar")
	if err := sanitizeImported(src, trimmed, nil); err != nil {
		t.Fatal(err)
	}
	if got := readTar(t, trimmed); got["checkpoint/"+plan.ReferenceFile] != nil || got["checkpoint/pages-1.img"] != nil {
		t.Fatalf("the trimmed archive kept entries of the source host's: %v", slices.Collect(maps.Keys(got)))
	}
	ours := plan.Reference{PlanID: "ours", PlanDir: "/run/tclone/plans/ours"}
	dst := filepath.Join(dir, "sib.tar")
	if err := writeSiblingArchive(trimmed, dst, siblingEdit{Reference: &ours}); err != nil {
		t.Fatal(err)
	}
	got, err := readReference(dst)
	if err != nil || got == nil || got.PlanID != "ours" {
		t.Fatalf("the sibling's archive has reference %+v (%v), want plan ours", got, err)
	}
}
