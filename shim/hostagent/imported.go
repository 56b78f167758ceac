package hostagent

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/containers/common/pkg/config"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

// An imported branch's checkpoint archive (Podman's config.dump and
// spec.dump) comes from the archive, so a start of one takes from it only
// what a container of its image, run on this host with Podman's defaults,
// could have had: whatever would make the container more than that
// (privileges, host namespaces or paths, devices, hooks, capabilities
// beyond this host's defaults, another container's namespaces, this host's
// secrets or volumes) is refused, naming the setting; what Podman works out
// again for a new container (its directories, lock, log and PID files,
// cgroup, OCI runtime) is dropped; and the archive keeps no entry but the
// two configurations and the checkpoint's inventory.

// configRefused are libpod container settings an imported branch may not
// carry, with why.
var configRefused = map[string]string{
	"privileged":         "a privileged container",
	"rootfs":             "a host directory as its root",
	"rootfs_mapping":     "an ID-mapped root",
	"overlayVolumes":     "host directories as overlay volumes",
	"ctrImageVolumes":    "this host's images as volumes",
	"secrets":            "this host's secrets",
	"secret_env":         "this host's secrets",
	"HostUsers":          "this host's users",
	"storageOpts":        "storage options",
	"chroot_directories": "chroot directories",
	"pod":                "a pod",
	"ipcNsCtr":           "another container's IPC namespace",
	"mountNsCtr":         "another container's mount namespace",
	"netNsCtr":           "another container's network namespace",
	"pidNsCtr":           "another container's PID namespace",
	"userNsCtr":          "another container's user namespace",
	"utsNsCtr":           "another container's UTS namespace",
	"cgroupNsCtr":        "another container's cgroup namespace",
	"cdiDevices":         "devices",
	"device_host_src":    "host devices",
	"mountAllDevices":    "every host device",
	"preserveFds":        "descriptors of the restoring process",
	"preserveFd":         "descriptors of the restoring process",
	"sdnotifySocket":     "a host socket for sd_notify",
	"noCgroups":          "no cgroup",
	"network_options":    "network options",
	"dependencies":       "dependencies on other containers",
}

// configDropped are settings Podman makes again for the new container.
var configDropped = []string{"staticDir", "ShmDir", "logPath", "lockID", "createdTime", "spec",
	"runtime", "cgroupManager", "namespace", "CreateCommand", "secretsPath",
	// Podman names these files in the source's own run directory on the
	// host it came from; without them it names them anew in the new
	// container's; and the cgroup parent it gave (its default there, or
	// the source's own choice of that host's cgroups) and the mounts it
	// added (its shm directory there).
	"conmonPidFile", "pid_file", "cgroupParent", "mounts"}

var timezoneRE = regexp.MustCompile(`^(local|[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*)$`)

// empty reports whether a decoded JSON value is its type's zero.
func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case float64:
		return x == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		for _, e := range x {
			if !empty(e) {
				return false
			}
		}
		return true
	}
	return false
}

func refuse(what string) error {
	return fmt.Errorf("%w: the branch was imported, and its configuration asks for %s, which a start of an imported branch never gives", podmanfork.ErrInvalidOption, what)
}

// checkImportedConfig checks and trims libpod's configuration.
func checkImportedConfig(data []byte) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("config.dump: %w", err)
	}
	for k, why := range configRefused {
		if !empty(cfg[k]) {
			return nil, refuse(why + " (" + k + ")")
		}
	}
	if err := checkIDMappings(asMap(cfg["idMappingsOptions"])); err != nil {
		return nil, err
	}
	for _, k := range configDropped {
		delete(cfg, k)
	}
	if mode, _ := cfg["networkMode"].(string); mode != "" && mode != "bridge" && mode != "none" && mode != "private" && mode != "slirp4netns" && mode != "pasta" {
		return nil, refuse("network mode " + mode)
	}
	if tz, _ := cfg["timezone"].(string); tz != "" && (!timezoneRE.MatchString(tz) || strings.Contains(tz, "..")) {
		return nil, refuse(fmt.Sprintf("timezone %q", tz))
	}
	if dest, _ := cfg["healthLogDestination"].(string); dest != "" && dest != "local" && dest != "events_logger" {
		return nil, refuse("a host path for health check logs")
	}
	if hosts, _ := cfg["baseHostsFile"].(string); hosts != "" && hosts != "none" && hosts != "image" {
		return nil, refuse("a host file as its /etc/hosts")
	}
	for _, x := range asList(cfg["namedVolumes"]) {
		v, _ := x.(map[string]any)
		for _, o := range asList(v["options"]) {
			if s, _ := o.(string); s == "suid" || s == "dev" {
				return nil, refuse("a volume mounted with " + s)
			}
		}
	}
	return json.Marshal(cfg)
}

func asList(v any) []any { l, _ := v.([]any); return l }

// checkIDMappings accepts only what Podman writes for a container without
// a user namespace of its own: the host's IDs, no maps, no automatic
// namespace.
func checkIDMappings(m map[string]any) error {
	for _, k := range []string{"UIDMap", "GIDMap", "AutoUserNs"} {
		if !empty(m[k]) {
			return refuse("user namespace mappings (idMappingsOptions." + k + ")")
		}
	}
	auto := asMap(m["AutoUserNsOpts"])
	for k, v := range auto {
		if !empty(v) {
			return refuse("user namespace mappings (idMappingsOptions.AutoUserNsOpts." + k + ")")
		}
	}
	for _, k := range []string{"HostUIDMapping", "HostGIDMapping"} {
		if v, ok := m[k].(bool); ok && !v {
			return refuse("user namespace mappings (idMappingsOptions." + k + " false)")
		}
	}
	return nil
}

// podmanOwnMounts are the bind mounts Podman makes for each container,
// and removes from a restored one's configuration to make again.
var podmanOwnMounts = []string{"/dev/shm", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts",
	"/run/.containerenv", "/run/secrets", "/var/run/.containerenv", "/var/run/secrets"}

// kernelMounts are the filesystems of a container's own kernel views.
var kernelMounts = map[string]string{"/proc": "proc", "/dev": "tmpfs", "/dev/pts": "devpts",
	"/dev/mqueue": "mqueue", "/sys": "sysfs", "/sys/fs/cgroup": "cgroup"}

// checkImportedSpec checks and trims the OCI configuration. volumes maps
// each named volume's mount point in the container to its directory here.
func checkImportedSpec(data []byte, volumes map[string]string) ([]byte, error) {
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("spec.dump: %w", err)
	}
	if !empty(spec["hooks"]) {
		return nil, refuse("hooks, which run on this host")
	}
	proc, _ := spec["process"].(map[string]any)
	if err := checkCaps(proc); err != nil {
		return nil, err
	}
	if label, _ := proc["selinuxLabel"].(string); label != "" {
		return nil, refuse("SELinux label " + label)
	}
	if adj, _ := proc["oomScoreAdj"].(float64); adj < 0 {
		return nil, refuse("protection from the OOM killer")
	}
	linux, _ := spec["linux"].(map[string]any)
	if err := checkLinux(linux); err != nil {
		return nil, err
	}
	mounts, err := checkMounts(asList(spec["mounts"]), volumes)
	if err != nil {
		return nil, err
	}
	spec["mounts"] = mounts
	if ann, ok := spec["annotations"].(map[string]any); ok {
		for k := range ann {
			if !strings.HasPrefix(k, "io.tclone.") && !strings.HasPrefix(k, "org.opencontainers.image.") && k != "io.container.manager" {
				delete(ann, k)
			}
		}
	}
	return json.Marshal(spec)
}

func checkCaps(proc map[string]any) error {
	allowed := defaultCaps()
	caps, _ := proc["capabilities"].(map[string]any)
	for set, list := range caps {
		for _, c := range asList(list) {
			if name, _ := c.(string); !slices.Contains(allowed, name) {
				return refuse(fmt.Sprintf("capability %s (%s set), beyond this host's defaults %v", name, set, allowed))
			}
		}
	}
	return nil
}

// defaultCaps are the capabilities Podman gives a container here.
func defaultCaps() []string {
	if c, err := config.Default(); err == nil {
		var out []string
		for _, name := range c.Containers.DefaultCapabilities.Get() {
			if !strings.HasPrefix(name, "CAP_") {
				name = "CAP_" + name
			}
			out = append(out, strings.ToUpper(name))
		}
		return out
	}
	return []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
		"CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"}
}

func checkLinux(linux map[string]any) error {
	need := map[string]bool{"pid": false, "ipc": false, "uts": false, "mount": false, "network": false}
	for _, x := range asList(linux["namespaces"]) {
		ns, _ := x.(map[string]any)
		typ, _ := ns["type"].(string)
		switch {
		case typ == "user":
			return refuse("a user namespace")
		case !empty(ns["path"]) && typ != "network":
			return refuse("the " + typ + " namespace at a path")
		}
		// Podman's restore puts the sibling's own network namespace path
		// in: the archive's is dropped.
		delete(ns, "path")
		need[typ] = true
	}
	for typ, ok := range need {
		if !ok {
			return refuse("this host's " + typ + " namespace")
		}
	}
	for _, k := range []string{"uidMappings", "gidMappings", "devices", "intelRdt", "personality", "timeOffsets", "mountLabel"} {
		if !empty(linux[k]) {
			return refuse(k)
		}
	}
	if prop, _ := linux["rootfsPropagation"].(string); strings.Contains(prop, "shared") {
		return refuse("shared mount propagation")
	}
	if linux["seccomp"] == nil {
		return refuse("no seccomp filter")
	}
	for k := range asMap(linux["sysctl"]) {
		if !strings.HasPrefix(k, "net.") && !strings.HasPrefix(k, "kernel.shm") && !strings.HasPrefix(k, "kernel.msg") && k != "kernel.sem" && !strings.HasPrefix(k, "fs.mqueue.") {
			return refuse("sysctl " + k + ", which is not namespaced")
		}
	}
	res := asMap(linux["resources"])
	for _, x := range asList(res["devices"]) {
		d := asMap(x)
		if allow, _ := d["allow"].(bool); allow {
			return refuse("access to devices in its device cgroup")
		}
	}
	delete(linux, "cgroupsPath")
	return nil
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// checkMounts keeps the container's kernel filesystems and tmpfs mounts,
// drops the mounts Podman makes again, points each named volume at its
// directory here, and refuses any other mount (a host path).
func checkMounts(mounts []any, volumes map[string]string) ([]any, error) {
	var out []any
	for _, x := range mounts {
		m := asMap(x)
		dest, _ := m["destination"].(string)
		typ, _ := m["type"].(string)
		dest = path.Clean(dest)
		switch {
		case slices.Contains(podmanOwnMounts, dest):
			continue
		case kernelMounts[dest] != "" && (typ == kernelMounts[dest] || (dest == "/sys/fs/cgroup" && typ == "cgroup2")):
		case typ == "tmpfs" && path.IsAbs(dest):
		case volumes[dest] != "":
			m["source"] = volumes[dest]
		default:
			src, _ := m["source"].(string)
			return nil, refuse(fmt.Sprintf("%s mounted at %s (%s)", src, dest, typ))
		}
		for _, o := range asList(m["options"]) {
			if s, _ := o.(string); s == "suid" || s == "dev" || s == "shared" || s == "rshared" {
				return nil, refuse(fmt.Sprintf("mount %s with %s", dest, s))
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// sanitizeImported rewrites an imported branch's checkpoint archive into
// dst: its two configurations checked and trimmed, its inventory, nothing
// else (Podman's restore would unpack any other entry into the sibling's
// bundle).
func sanitizeImported(src, dst string, volumes map[string]string) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	seen := map[string]bool{}
	err = walkArchive(src, func(h *tar.Header, r io.Reader) error {
		name := path.Clean(h.Name)
		keep := name == configDump || name == specDump || name == "checkpoint/inventory.img"
		if !keep || h.Typeflag != tar.TypeReg || seen[name] || h.Size > 16<<20 {
			return nil
		}
		seen[name] = true
		data, err := io.ReadAll(io.LimitReader(r, h.Size))
		if err != nil {
			return err
		}
		switch name {
		case configDump:
			data, err = checkImportedConfig(data)
		case specDump:
			data, err = checkImportedSpec(data, volumes)
		}
		if err != nil {
			return err
		}
		return writeTarFile(tw, name, data)
	})
	if err == nil && (!seen[configDump] || !seen[specDump]) {
		err = fmt.Errorf("the branch's checkpoint archive lacks %s or %s", configDump, specDump)
	}
	if err == nil && !seen["checkpoint/inventory.img"] {
		err = writeTarFile(tw, "checkpoint/inventory.img", nil)
	}
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}

func writeTarFile(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// localizeVolumes gives an imported branch's volumes this host's
// directories: each named volume's copy is made by Podman in volumeRoot.
// A volume the source shared, or a host directory it mounted, is refused:
// an archive must not choose which of this host's data its containers get.
func localizeVolumes(uses []podmanfork.VolumeUse, planVols []plan.Volume, volumeRoot string) (map[string]string, error) {
	byDest := map[string]string{}
	for i := range uses {
		u := &uses[i]
		switch {
		case u.Mode == podmanfork.VolumeBind:
			return nil, refuse(fmt.Sprintf("host directory %s mounted at %s", u.Source, u.Destination))
		case u.Mode == podmanfork.VolumeShare:
			return nil, refuse(fmt.Sprintf("this host's volume %s, shared (it was created with --volume-mode share)", u.Name))
		case u.Mode != podmanfork.VolumeCopy || !volumeNameRE.MatchString(u.Name) || !filepath.IsAbs(u.Destination) || filepath.Clean(u.Destination) != u.Destination:
			return nil, refuse(fmt.Sprintf("volume %q at %q", u.Name, u.Destination))
		}
		u.Source = filepath.Join(volumeRoot, u.Name, "_data")
		byDest[u.Destination] = u.Source
	}
	for _, v := range planVols {
		if v.Name == "/dev/shm" && v.Destination == "/dev/shm" {
			continue
		}
		if _, ok := byDest[v.Destination]; !ok {
			return nil, refuse(fmt.Sprintf("a copy of volume %s put at %s, where the container mounts no volume of its own", v.Name, v.Destination))
		}
	}
	return byDest, nil
}

var volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
