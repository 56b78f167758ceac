package criimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name string
	typ  byte
	data string
}

// writeArchive writes a tar of entries, as the CRI's checkpoint archive.
func writeArchive(t *testing.T, entries []entry) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "checkpoint.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o600, Size: int64(len(e.data))}
		if e.typ == tar.TypeDir || e.typ == tar.TypeSymlink {
			h.Size = 0
			h.Linkname = e.data
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.data))
		}
	}
	tw.Close()
	f.Close()
	return path
}

func criArchive() []entry {
	return []entry{
		{"spec.dump", tar.TypeReg, `{}`},
		{"config.dump", tar.TypeReg, `{"rootfsImageName":"localhost:5000/busybox:latest"}`},
		{"status.dump", tar.TypeReg, `{}`},
		{"./checkpoint/", tar.TypeDir, ""},
		{"checkpoint/inventory.img", tar.TypeReg, "criu"},
		{"rootfs-diff.tar", tar.TypeReg, ""},
	}
}

// readOCI reads an OCI image archive's files.
func readOCI(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
}

func blob(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("blob %s holds other bytes", digest)
	}
	return b
}

// The image: its name in the layout's index as containerd's import reads
// it, the annotations on its manifest (where containerd's CRI looks for
// the checkpoint's), and the archive, byte for byte, as its one layer.
func TestWriteImage(t *testing.T) {
	archive := writeArchive(t, criArchive())
	var out bytes.Buffer
	img, err := Write(&out, "localhost:5000/ws-ckpt", archive, map[string]string{AnnotationName: "main", AnnotationPod: "ws", AnnotationHostKernel: ""})
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "localhost:5000/ws-ckpt:latest" {
		t.Errorf("name %q", img.Name)
	}
	files := readOCI(t, out.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %q", files["oci-layout"])
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	m := index.Manifests[0]
	if m.Digest != img.Digest || m.Annotations[annotationImageName] != img.Name || m.Annotations[annotationRefName] != "latest" {
		t.Errorf("index entry %+v, image %+v", m, img)
	}
	var manifest struct {
		MediaType   string            `json:"mediaType"`
		Config      descriptor        `json:"config"`
		Layers      []descriptor      `json:"layers"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(blob(t, files, m.Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.MediaType != mediaManifest || manifest.Annotations[AnnotationName] != "main" || manifest.Annotations[AnnotationPod] != "ws" || len(manifest.Layers) != 1 {
		t.Fatalf("manifest %+v", manifest)
	}
	if _, ok := manifest.Annotations[AnnotationHostKernel]; ok {
		t.Error("an annotation without a value is written")
	}
	want, _ := os.ReadFile(archive)
	if layer := blob(t, files, manifest.Layers[0].Digest); !bytes.Equal(layer, want) || int64(len(want)) != img.LayerBytes || manifest.Layers[0].Size != img.LayerBytes {
		t.Error("the layer is not the archive")
	}
	var config struct {
		OS     string `json:"os"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("config %+v: its diff ID must be the uncompressed layer's digest", config)
	}
}

// What is not a checkpoint image is refused, naming what is wrong.
func TestWriteRefuses(t *testing.T) {
	good := writeArchive(t, criArchive())
	name := map[string]string{AnnotationName: "main"}
	cases := []struct {
		what, ref, archive string
		ann                map[string]string
		want               string
	}{
		{"an upper-case name", "localhost:5000/WS", good, name, "image name"},
		{"a digest", "localhost:5000/ws@sha256:" + strings.Repeat("a", 64), good, name, "a digest names an image that exists"},
		{"no container name", "ws", good, map[string]string{}, AnnotationName},
		{"no spec.dump", "ws", writeArchive(t, criArchive()[1:]), name, "no spec.dump"},
		{"a symlink", "ws", writeArchive(t, append(criArchive(), entry{"checkpoint/link", tar.TypeSymlink, "/etc/passwd"})), name, "neither a file nor a directory"},
		{"a fork's reference", "ws", writeArchive(t, append(criArchive(), entry{"checkpoint/tclone-plan.json", tar.TypeReg, "{}"})), name, "fork's checkpoint"},
		{"not a tar", "ws", func() string {
			p := filepath.Join(t.TempDir(), "x")
			os.WriteFile(p, bytes.Repeat([]byte("x"), 1024), 0o600)
			return p
		}(), name, "not a CRI checkpoint archive"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		if _, err := Write(&out, c.ref, c.archive, c.ann); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.what, err, c.want)
		}
	}
}

func TestName(t *testing.T) {
	for in, want := range map[string]string{
		"ws":                        "docker.io/library/ws:latest",
		"localhost:5000/team/ws:v2": "localhost:5000/team/ws:v2",
		"registry.example/ws":       "registry.example/ws:latest",
	} {
		if got, err := Name(in); err != nil || got != want {
			t.Errorf("Name(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
