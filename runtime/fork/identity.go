package fork

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/plan"
)

// shortID is a container's default hostname: Podman and Docker use the first
// 12 characters of a 64-character ID.
func shortID(id string) string {
	if len(id) == 64 {
		return id[:12]
	}
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

// siblingHostname decides the sibling's hostname. An explicit hostname in
// the sibling's config that differs from the source's wins, and so does the
// hostname of a UTS namespace the config joins (a Kubernetes pod's: every
// container of a pod has the pod's hostname, which the CRI set there).
// Otherwise a unique identity gives the sibling its own short ID, and
// preserve keeps the source's. An empty result means "leave the captured
// hostname".
func siblingHostname(p *plan.Plan, spec *specs.Spec, siblingID string) string {
	if spec.Hostname != "" && spec.Hostname != p.Source.Hostname {
		return spec.Hostname
	}
	if path, ok := joinedUTS(spec); ok {
		if name, err := hostnameIn(path); err == nil && name != "" {
			return name
		}
	}
	if p.Identity == forkopts.IdentityPreserve {
		return ""
	}
	return shortID(siblingID)
}

var machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}\n?$`)

// freshMachineID gives the sibling its own /etc/machine-id when the image has
// one. An empty or absent file is left alone: the image then has no identity
// to duplicate. The path is resolved inside the sibling's root: the root came
// from the source container, whose processes could have made /etc a symlink
// to anywhere on the host.
func freshMachineID(root string) (bool, error) {
	f, err := openInRoot(root, "etc/machine-id", unix.O_RDWR)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return false, err
	}
	old := make([]byte, 64)
	n, err := f.ReadAt(old, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	if !machineIDRE.Match(old[:n]) {
		return false, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return false, err
	}
	// Same length as before: CRIU checks the size of files the tree holds
	// open.
	fresh := []byte(hex.EncodeToString(b) + "\n")
	if err := f.Truncate(0); err != nil {
		return false, err
	}
	_, err = f.WriteAt(fresh, 0)
	return err == nil, err
}

// openInRoot opens rel with every path component resolved inside root, as
// if root were "/": symlinks, including absolute ones, cannot lead out.
func openInRoot(root, rel string, flags int) (*os.File, error) {
	dir, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, rel)), nil
}

// rewriteNameFiles updates the sibling's private /etc/hostname and
// /etc/hosts bind-mount sources for a new hostname. Only files that belong to
// the sibling (inside its bundle, or in Podman's per-container userdata
// directory named after it) are touched; a file shared with the host or the
// source never is.
func rewriteNameFiles(spec *specs.Spec, bundle, siblingID, oldName, newName string) error {
	if oldName == "" || oldName == newName {
		return nil
	}
	for _, m := range spec.Mounts {
		if !isBind(m) || !ownedBySibling(m.Source, bundle, siblingID) {
			continue
		}
		var err error
		switch m.Destination {
		case "/etc/hostname":
			err = rewriteFile(m.Source, func([]byte) []byte { return []byte(newName + "\n") })
		case "/etc/hosts":
			err = rewriteFile(m.Source, func(data []byte) []byte { return replaceHostToken(data, oldName, newName) })
		}
		if err != nil {
			return fmt.Errorf("updating %s for hostname %s: %w", m.Source, newName, err)
		}
	}
	return nil
}

// ownedBySibling accepts a file inside the sibling's bundle, or Podman's
// .../<ID>/userdata/<file> for this sibling's ID.
func ownedBySibling(path, bundle, siblingID string) bool {
	path = filepath.Clean(path)
	if rel, err := filepath.Rel(bundle, path); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
		return true
	}
	userdata := filepath.Dir(path)
	return filepath.Base(userdata) == "userdata" && filepath.Base(filepath.Dir(userdata)) == siblingID
}

// rewriteFile replaces a regular file's content in place, refusing to
// follow a symlink.
func rewriteFile(path string, edit func([]byte) []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt(edit(data), 0)
	return err
}

func replaceHostToken(data []byte, oldName, newName string) []byte {
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		fields := strings.Fields(line)
		changed := false
		for j := 1; j < len(fields); j++ {
			if fields[j] == oldName {
				fields[j] = newName
				changed = true
			}
		}
		if changed {
			lines[i] = strings.Join(fields, "\t")
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// hostnameIn is the hostname of the UTS namespace at path. A thread of its
// own enters the namespace and is never let back to the Go scheduler: it
// ends with its goroutine, namespace and all.
func hostnameIn(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	type answer struct {
		name string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWUTS); err != nil {
			done <- answer{err: fmt.Errorf("entering the UTS namespace %s: %w", path, err)}
			return
		}
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			done <- answer{err: err}
			return
		}
		done <- answer{name: unix.ByteSliceToString(u.Nodename[:])}
	}()
	a := <-done
	return a.name, a.err
}

// joinedUTS is the path of the UTS namespace spec joins, if it joins one.
func joinedUTS(spec *specs.Spec) (string, bool) {
	if spec.Linux == nil {
		return "", false
	}
	path, ok := namespacePath(spec, specs.UTSNamespace)
	return path, ok && path != ""
}
