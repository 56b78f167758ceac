package hostagent

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containers/podman/v5/libpod/define"

	"github.com/tclone/tclone/shim/podmanfork"
)

func volumeSource() *define.InspectContainerData {
	return &define.InspectContainerData{Name: "ws", Mounts: []define.InspectMount{
		{Type: "volume", Name: "db", Source: "/var/lib/containers/storage/volumes/db/_data", Destination: "/db", Driver: "local"},
		{Type: "volume", Name: "cache", Source: "/var/lib/containers/storage/volumes/cache/_data", Destination: "/cache", Driver: "local"},
		{Type: "bind", Source: "/srv/code", Destination: "/code"},
	}}
}

// Named volumes are copied unless shared; host directories are always
// shared, and asking to copy one, or naming a volume the source does not
// have, is refused saying why.
func TestPlanVolumes(t *testing.T) {
	copies, uses, err := planVolumes(volumeSource(), podmanfork.VolumeModes{ByName: map[string]podmanfork.VolumeMode{"cache": podmanfork.VolumeShare}})
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 1 || copies[0].Name != "db" || copies[0].Destination != "/db" {
		t.Errorf("copies %+v", copies)
	}
	modes := map[string]podmanfork.VolumeMode{}
	for _, u := range uses {
		modes[u.Destination] = u.Mode
	}
	if modes["/db"] != podmanfork.VolumeCopy || modes["/cache"] != podmanfork.VolumeShare || modes["/code"] != podmanfork.VolumeBind {
		t.Errorf("uses %+v", uses)
	}
	if copies, _, _ := planVolumes(volumeSource(), podmanfork.VolumeModes{Default: podmanfork.VolumeShare}); len(copies) != 0 {
		t.Errorf("share copied %+v", copies)
	}
	for modes, want := range map[string]podmanfork.VolumeModes{
		"always shared":       {ByName: map[string]podmanfork.VolumeMode{"/code": podmanfork.VolumeCopy}},
		"no volume named web": {ByName: map[string]podmanfork.VolumeMode{"web": podmanfork.VolumeShare}},
	} {
		if _, _, err := planVolumes(volumeSource(), want); err == nil || !strings.Contains(err.Error(), modes) {
			t.Errorf("%+v: %v, want an error saying %q", want, err, modes)
		}
	}
	// Volumes a copy could not reproduce.
	src := volumeSource()
	src.Mounts[0].SubPath = "part"
	src.Mounts[1].Driver = "nfs-plugin"
	if _, _, err := planVolumes(src, podmanfork.VolumeModes{ByName: map[string]podmanfork.VolumeMode{"cache": podmanfork.VolumeShare}}); err == nil || !strings.Contains(err.Error(), "subpath") {
		t.Errorf("a volume mounted with a subpath: %v", err)
	}
	if _, _, err := planVolumes(src, podmanfork.VolumeModes{ByName: map[string]podmanfork.VolumeMode{"db": podmanfork.VolumeShare}}); err == nil || !strings.Contains(err.Error(), "driver") {
		t.Errorf("a volume of another driver: %v", err)
	}
}

// A sibling's archive mounts its own copy of each copied volume, an
// anonymous one created without the image's files, and carries neither
// Podman's volume tars nor its /dev/shm tar.
func TestWriteSiblingArchiveVolumes(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.tar")
	config := map[string]any{"namedVolumes": []any{
		map[string]any{"volumeName": "db", "dest": "/db", "options": []any{"rbind"}},
		map[string]any{"volumeName": "cache", "dest": "/cache", "setAnonymous": true},
	}}
	spec := map[string]any{"mounts": []any{
		map[string]any{"destination": "/db", "source": "/v/db/_data"},
		map[string]any{"destination": "/cache", "source": "/v/cache/_data"},
	}}
	writeTar(t, src, map[string]any{"config.dump": config, "spec.dump": spec},
		map[string]string{"volumes/db.tar": "big", devShmTar: "shm", "checkpoint/inventory.img": "x"})
	dst := filepath.Join(dir, "sib.tar")
	edit := siblingEdit{Volumes: map[string]string{"db": "db-sib"}, VolumePaths: map[string]string{"/v/db/_data": "/v/db-sib/_data"}}
	if err := writeSiblingArchive(src, dst, edit); err != nil {
		t.Fatal(err)
	}
	out := readTar(t, dst)
	for _, gone := range []string{"volumes/db.tar", devShmTar} {
		if _, ok := out[gone]; ok {
			t.Errorf("%s was kept", gone)
		}
	}
	var cfg struct {
		NamedVolumes []struct {
			Name      string   `json:"volumeName"`
			Options   []string `json:"options"`
			Anonymous bool     `json:"setAnonymous"`
		} `json:"namedVolumes"`
	}
	var sp struct {
		Mounts []struct{ Destination, Source string }
	}
	json.Unmarshal(out["config.dump"], &cfg)
	json.Unmarshal(out["spec.dump"], &sp)
	db, cache := cfg.NamedVolumes[0], cfg.NamedVolumes[1]
	if db.Name != "db-sib" || !db.Anonymous || strings.Join(db.Options, ",") != "rbind,nocopy" {
		t.Errorf("copied volume %+v", db)
	}
	// A shared anonymous volume of the source stays the source's.
	if cache.Name != "cache" || cache.Anonymous || len(cache.Options) != 0 {
		t.Errorf("shared volume changed: %+v", cache)
	}
	if sp.Mounts[0].Source != "/v/db-sib/_data" || sp.Mounts[1].Source != "/v/cache/_data" {
		t.Errorf("spec mounts %+v", sp.Mounts)
	}
}
