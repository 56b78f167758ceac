package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// merged is what a container sees of upper over lowers (top first).
func merged(t *testing.T, upper string, lowers []string) string {
	t.Helper()
	target := t.TempDir()
	if _, err := (&Snapshot{Kind: KindOverlay, Path: upper, LowerDirs: lowers}).Apply(target); err != nil {
		t.Fatal(err)
	}
	return target
}

// contents lists a tree with what each entry holds.
func contents(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, rel := range tree(t, root) {
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, rel+" -> "+l)
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			out = append(out, rel+" = "+string(data)+" "+fi.Mode().String())
		default:
			out = append(out, rel+" "+fi.Mode().String())
		}
	}
	return out
}

// applyPodmanWay applies a layer diff as Podman's restore does: the tar
// over the image's files, then the deletions.
func applyPodmanWay(t *testing.T, root string, diff []byte, deleted []string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(diff))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		if fi, err := os.Lstat(p); err == nil && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
			os.RemoveAll(p)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			write(t, p, string(data), os.FileMode(h.Mode))
		case tar.TypeSymlink:
			os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			os.Link(filepath.Join(root, h.Linkname), p)
		}
	}
	for _, d := range deleted {
		os.RemoveAll(filepath.Join(root, d))
	}
}

// A layer diff of an upper layer, applied Podman's way over the image,
// gives what the container saw; and the upper layer made back from the
// diff gives it again under overlay's rules.
func TestLayerDiffRoundTrip(t *testing.T) {
	needRoot(t)
	bottom, top, upper := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, filepath.Join(bottom, "etc/keep"), "keep", 0o644)
	write(t, filepath.Join(bottom, "etc/gone"), "gone", 0o644)
	write(t, filepath.Join(bottom, "etc/changed"), "old", 0o644)
	write(t, filepath.Join(bottom, "opaque/hidden-bottom"), "x", 0o644)
	write(t, filepath.Join(bottom, "opaque/sub/deep"), "x", 0o644)
	write(t, filepath.Join(bottom, "opaque/hidden-by-top"), "x", 0o644)
	write(t, filepath.Join(top, "opaque/hidden-top"), "x", 0o644)
	whiteout(t, filepath.Join(top, "opaque/hidden-by-top"))
	write(t, filepath.Join(bottom, "dir-to-file/x"), "x", 0o644)

	write(t, filepath.Join(upper, "etc/changed"), "new", 0o600)
	whiteout(t, filepath.Join(upper, "etc/gone"))
	write(t, filepath.Join(upper, "etc/added"), "added", 0o755)
	if err := os.Link(filepath.Join(upper, "etc/added"), filepath.Join(upper, "etc/added-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("added", filepath.Join(upper, "etc/sym")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(upper, "opaque/new"), "new", 0o644)
	write(t, filepath.Join(upper, "opaque/sub/fresh"), "fresh", 0o644)
	setXattr(t, filepath.Join(upper, "opaque"), xattrOpaque, "y")
	write(t, filepath.Join(upper, "dir-to-file"), "now a file", 0o644)
	lowers := []string{top, bottom}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	deleted, err := WriteLayerDiff(upper, lowers, tw)
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	if want := []string{"/etc/gone", "/opaque/hidden-bottom", "/opaque/hidden-top", "/opaque/sub/deep"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	for _, n := range names(t, buf.Bytes()) {
		if strings.Contains(n, "gone") || strings.Contains(n, "hidden") {
			t.Errorf("the diff's tar holds %s", n)
		}
	}

	want := contents(t, merged(t, upper, lowers))
	podman := merged(t, t.TempDir(), lowers)
	applyPodmanWay(t, podman, buf.Bytes(), deleted)
	if got := contents(t, podman); !slices.Equal(got, want) {
		t.Errorf("applied Podman's way:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	back := filepath.Join(t.TempDir(), "upper")
	if err := LayerFromDiff(bytes.NewReader(buf.Bytes()), deleted, back); err != nil {
		t.Fatal(err)
	}
	if got := contents(t, merged(t, back, lowers)); !slices.Equal(got, want) {
		t.Errorf("the layer made back:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := lstat(t, filepath.Join(back, "etc/added")); st.Nlink != 2 {
		t.Errorf("a hard link came back as a copy (%d links)", st.Nlink)
	}
}

func names(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

// A diff is untrusted: nothing it holds reaches outside the layer made
// from it, and it cannot make devices.
func TestLayerFromDiffRefusesEscapes(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	for _, c := range []struct {
		name    string
		entries []tar.Header
		deleted []string
		want    string
	}{
		{"dot-dot", []tar.Header{{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}}, nil, "not a path inside"},
		{"absolute", []tar.Header{{Name: "/x/../../y", Typeflag: tar.TypeReg, Mode: 0o644}}, nil, "not a path inside"},
		{"through-symlink", []tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644},
		}, nil, "escapes"},
		{"hard-link-out", []tar.Header{{Name: "x", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}, nil, "outside the root filesystem"},
		{"device", []tar.Header{{Name: "sda", Typeflag: tar.TypeBlock, Mode: 0o600, Devmajor: 8}}, nil, "not allowed"},
		{"deleted-through-symlink", []tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}}, []string{"/l/x"}, "escapes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range c.entries {
				if err := tw.WriteHeader(&h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			err := LayerFromDiff(&buf, c.deleted, filepath.Join(t.TempDir(), "upper"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
			if got := tree(t, outside); len(got) != 0 {
				t.Errorf("wrote outside: %v", got)
			}
		})
	}
}
