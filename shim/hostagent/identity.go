package hostagent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containers/podman/v5/libpod/define"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/podmanfork"
)

// identityLimits lists what keeps siblings of src from getting their own
// hostname or machine-id, keyed by the part.
func identityLimits(src *define.InspectContainerData) map[string]string {
	limits := map[string]string{}
	if src.HostConfig != nil {
		if uts := src.HostConfig.UTSMode; uts != "" && uts != "private" {
			limits["hostname"] = fmt.Sprintf("the source shares a UTS namespace (--uts=%s), so its hostname cannot differ", uts)
		}
	}
	for _, m := range src.Mounts {
		switch filepath.Clean(m.Destination) {
		case "/etc/machine-id", "/etc":
			limits["machine_id"] = fmt.Sprintf("%s is mounted into the source from %s, so siblings share it", m.Destination, m.Source)
		}
	}
	return limits
}

// checkIdentity refuses, under the unique policy, a source whose siblings
// could not get their own identity; best-effort goes on and reports it.
func checkIdentity(policy forkopts.Identity, src *define.InspectContainerData) (map[string]string, error) {
	limits := identityLimits(src)
	if policy != forkopts.IdentityUnique || len(limits) == 0 {
		return limits, nil
	}
	var why []string
	for _, part := range []string{"hostname", "machine_id"} {
		if l, ok := limits[part]; ok {
			why = append(why, l)
		}
	}
	return nil, fmt.Errorf("cannot give siblings of %s their own identity: %s; fork with --identity best-effort to keep what cannot change (the stats say what was kept), or --identity preserve",
		src.Name, strings.Join(why, "; "))
}

// sourceIdentity is what the source is, read once per fork.
type sourceIdentity struct {
	hostname  string
	utsNS     string
	machineID string
}

func readSourceIdentity(src *define.InspectContainerData) sourceIdentity {
	id := sourceIdentity{}
	if src.Config != nil {
		id.hostname = src.Config.Hostname
	}
	if src.State != nil && src.State.Pid > 0 {
		id.utsNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/uts", src.State.Pid))
		id.machineID = readMachineID(src.State.Pid)
	}
	return id
}

// verifyIdentity reports what the running sibling has of its own, and
// fails under unique if it kept something of the source's.
func (f *forker) verifyIdentity(r *podmanfork.Result) error {
	rep := podmanfork.IdentityReport{Hostname: podmanfork.IdentityOwn, MachineID: podmanfork.IdentityOwn}
	uts, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/uts", f.pid(r)))
	// A hostname the user chose equal to the source's is still the
	// sibling's own; only a shared UTS namespace, or preserve, keeps it.
	if (uts != "" && uts == f.srcID.utsNS) || f.opts.Identity == forkopts.IdentityPreserve {
		rep.Hostname = podmanfork.IdentityKept
	}
	switch mid := readMachineID(f.pid(r)); {
	case mid == "":
		rep.MachineID = podmanfork.IdentityNone
	case mid == f.srcID.machineID:
		rep.MachineID = podmanfork.IdentityKept
	}
	r.Identity = rep
	if f.opts.Identity == forkopts.IdentityPreserve {
		return nil
	}
	kept := map[string]string{}
	if rep.Hostname == podmanfork.IdentityKept {
		kept["hostname"] = fmt.Sprintf("it kept the source's hostname %q", f.srcID.hostname)
	}
	if rep.MachineID == podmanfork.IdentityKept {
		kept["machine_id"] = "it kept the source's /etc/machine-id"
	}
	for _, part := range []string{"hostname", "machine_id"} {
		if why, ok := kept[part]; ok {
			if limit := f.identityLimits[part]; limit != "" {
				why = limit
			}
			r.Identity.Kept = append(r.Identity.Kept, why)
		}
	}
	if f.opts.Identity == forkopts.IdentityUnique && len(r.Identity.Kept) > 0 {
		return fmt.Errorf("%s, though --identity unique asks for its own", strings.Join(r.Identity.Kept, " and "))
	}
	return nil
}

var machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// readMachineID reads /etc/machine-id as process pid sees it (its root and
// mounts). The path is resolved inside that root, so a link in the
// container cannot lead the read to a host file. "" means there is none,
// or not a machine ID (an image's empty or "uninitialized" placeholder).
func readMachineID(pid int) string {
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return ""
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), "etc/machine-id", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(fd), "machine-id")
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return ""
	}
	id := strings.TrimSpace(string(data))
	if !machineIDRE.MatchString(id) {
		return ""
	}
	return id
}
