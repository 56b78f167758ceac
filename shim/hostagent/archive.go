package hostagent

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/containers/storage/pkg/archive"

	"github.com/tclone/tclone/runtime/plan"
)

// Podman's checkpoint archive holds the container's configuration next to
// the checkpoint directory; restore --import creates the new container from
// it. A fork archive's checkpoint directory holds only a plan reference.
const (
	configDump = "config.dump"
	specDump   = "spec.dump"
	// devShmTar is Podman's copy of the source's /dev/shm, made after the
	// source ran on. tclone carries /dev/shm as it was at the fork
	// instant instead, into a /dev/shm that must be empty.
	devShmTar = "devshm-checkpoint.tar"
	// volumesDir holds Podman's tar of each named volume, also made after
	// the source ran on (its REST checkpoint cannot leave them out). A
	// sibling gets tclone's copies, or shares the source's volume.
	volumesDir = "volumes"
	planRef    = "checkpoint/" + plan.ReferenceFile
)

// readReference finds the plan reference in an exported checkpoint archive.
// An archive without one is an ordinary checkpoint: tclone did not capture a
// plan, so the source is not running under tclone.
func readReference(archivePath string) (*plan.Reference, error) {
	var ref *plan.Reference
	err := walkArchive(archivePath, func(h *tar.Header, r io.Reader) error {
		if path.Clean(h.Name) != planRef {
			return nil
		}
		ref = &plan.Reference{}
		return json.NewDecoder(r).Decode(ref)
	})
	if err != nil {
		return nil, err
	}
	if ref == nil {
		return nil, errors.New("tclone did not capture a fork plan for this checkpoint: the Podman service runs the source with another runtime, runs on another host, or began the checkpoint after the fork request expired")
	}
	return ref, nil
}

func walkArchive(archivePath string, fn func(*tar.Header, io.Reader) error) error {
	f, err := os.Open(archivePath)
	if err != nil {
		return err
	}
	defer f.Close()
	// Podman may compress its export; this reads any of its formats.
	rc, err := archive.DecompressStream(f)
	if err != nil {
		return fmt.Errorf("reading checkpoint archive %s: %w", archivePath, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading checkpoint archive %s: %w", archivePath, err)
		}
		if err := fn(h, tr); err != nil {
			return fmt.Errorf("%s in %s: %w", h.Name, archivePath, err)
		}
	}
}

// siblingEdit is what one sibling's archive changes in the source's
// configuration.
type siblingEdit struct {
	Hostname string            // "" keeps the source's
	Labels   map[string]string // added to the source's
	// DropPorts removes the source's published ports: they belong to the
	// source, and a sibling that kept them would fail to bind.
	DropPorts bool
	// Volumes renames named volumes: the sibling mounts a new volume of
	// its own, anonymous (removed with `podman rm -v`), created without
	// the image's files (tclone fills it with the source's).
	Volumes map[string]string
	// VolumePaths moves mounts of the spec from the source's volume
	// directories to the sibling's: Podman's restore mounts what the
	// spec names.
	VolumePaths map[string]string
	// Reference, when set, replaces the archive's plan reference: siblings
	// started from a branch use the plan made from it.
	Reference *plan.Reference
}

// writeSiblingArchive copies the source's checkpoint archive with the
// sibling's configuration edits applied. The result is uncompressed: it is a
// few kilobytes.
func writeSiblingArchive(src, dst string, edit siblingEdit) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	var ref []byte
	if edit.Reference != nil {
		if ref, err = json.Marshal(edit.Reference); err != nil {
			out.Close()
			return err
		}
	}
	refWritten := false
	err = walkArchive(src, func(h *tar.Header, r io.Reader) error {
		name := path.Clean(h.Name)
		if name == devShmTar || name == volumesDir || strings.HasPrefix(name, volumesDir+"/") {
			return nil
		}
		if name == planRef && ref != nil {
			if refWritten {
				return nil
			}
			refWritten = true
			return replaceEntry(tw, h, ref)
		}
		if name != configDump && name != specDump {
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			_, err := io.Copy(tw, r)
			return err
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if name == configDump {
			data, err = editConfig(data, edit)
		} else {
			data, err = editSpec(data, edit)
		}
		if err != nil {
			return err
		}
		return replaceEntry(tw, h, data)
	})
	// An archive without a reference (an imported branch's keeps none of
	// the source host's) gets the sibling's.
	if err == nil && ref != nil && !refWritten {
		err = writeTarFile(tw, planRef, ref)
	}
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// replaceEntry writes the entry of h with data in place of its contents.
func replaceEntry(tw *tar.Writer, h *tar.Header, data []byte) error {
	nh := *h
	nh.Size = int64(len(data))
	if err := tw.WriteHeader(&nh); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// editConfig edits libpod's container configuration. It is decoded
// generically so that fields this code does not know pass through
// untouched.
func editConfig(data []byte, edit siblingEdit) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, err
	}
	if len(edit.Labels) > 0 {
		labels, _ := cfg["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
		}
		for k, v := range edit.Labels {
			labels[k] = v
		}
		cfg["labels"] = labels
	}
	if edit.DropPorts {
		delete(cfg, "newPortMappings")
		delete(cfg, "portMappings")
		delete(cfg, "exposedPorts")
	}
	if edit.Volumes != nil {
		vols, _ := cfg["namedVolumes"].([]any)
		for _, x := range vols {
			v, _ := x.(map[string]any)
			name, _ := v["volumeName"].(string)
			renamed, ok := edit.Volumes[name]
			if !ok {
				// Shared with the source: never the sibling's to remove
				// with `podman rm -v`, even a source's anonymous one.
				delete(v, "setAnonymous")
				continue
			}
			v["volumeName"] = renamed
			v["setAnonymous"] = true
			opts, _ := v["options"].([]any)
			v["options"] = append(opts, "nocopy")
		}
	}
	if edit.Hostname != "" {
		if spec, ok := cfg["spec"].(map[string]any); ok {
			spec["hostname"] = edit.Hostname
		}
	}
	return json.Marshal(cfg)
}

func editSpec(data []byte, edit siblingEdit) ([]byte, error) {
	if edit.Hostname == "" && len(edit.VolumePaths) == 0 {
		return data, nil
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, err
	}
	if edit.Hostname != "" {
		spec["hostname"] = edit.Hostname
	}
	mounts, _ := spec["mounts"].([]any)
	for _, x := range mounts {
		m, _ := x.(map[string]any)
		src, _ := m["source"].(string)
		if moved, ok := edit.VolumePaths[src]; ok {
			m["source"] = moved
		}
	}
	return json.Marshal(spec)
}
