package fork

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

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
// the sibling's config that differs from the source's wins. Otherwise a
// unique identity gives the sibling its own short ID, and preserve keeps the
// source's. An empty result means "leave the captured hostname".
func siblingHostname(p *plan.Plan, spec *specs.Spec, siblingID string) string {
	if spec.Hostname != "" && spec.Hostname != p.Source.Hostname {
		return spec.Hostname
	}
	if p.Identity == plan.IdentityPreserve {
		return ""
	}
	return shortID(siblingID)
}

var machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}\n?$`)

// freshMachineID gives the sibling its own /etc/machine-id when the image has
// one. An empty or absent file is left alone: the image then has no identity
// to duplicate.
func freshMachineID(root string) (bool, error) {
	path := filepath.Join(root, "etc", "machine-id")
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !st.Mode().IsRegular()) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	if !machineIDRE.Match(old) {
		return false, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return false, err
	}
	// Same length as before: CRIU checks the size of files the tree holds
	// open.
	return true, os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), st.Mode().Perm())
}

// rewriteNameFiles updates the sibling's private /etc/hostname and
// /etc/hosts bind-mount sources for a new hostname. Only files that belong to
// the sibling (inside its bundle, or in a directory named after it) are
// touched; a file shared with the host or the source never is.
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
			err = os.WriteFile(m.Source, []byte(newName+"\n"), 0o644)
		case "/etc/hosts":
			err = replaceHostToken(m.Source, oldName, newName)
		}
		if err != nil {
			return fmt.Errorf("updating %s for hostname %s: %w", m.Source, newName, err)
		}
	}
	return nil
}

func ownedBySibling(path, bundle, siblingID string) bool {
	rel, err := filepath.Rel(bundle, path)
	if err == nil && !strings.HasPrefix(rel, "..") {
		return true
	}
	for _, part := range strings.Split(filepath.Clean(path), string(filepath.Separator)) {
		if part == siblingID {
			return true
		}
	}
	return false
}

func replaceHostToken(path, oldName, newName string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
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
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
}
