package fork

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/criucheck"
)

// tclone's build of CRIU is used only for the host's CRIU version, only
// where its criu is installed, and is given only the options its stamp
// lists: a build from before the stamp listed them has lazy-pages-external
// alone, and no dump of it is configured with tmpfs-builtin-tar.
func TestInstalledBuildOptions(t *testing.T) {
	check := &criucheck.Result{Version: criucheck.Version(40201)}
	for _, c := range []struct {
		name, stamp string
		criu        bool
		path        bool
		conf        []string
	}{
		{"options listed", "4.2.1 sum patch\nplugin\noptions lazy-pages-external tmpfs-builtin-tar\n", true, true, []string{criuhooks.TmpfsBuiltinTar}},
		{"older stamp", "4.2.1 sum patch\nplugin\n", true, true, nil},
		{"other CRIU version", "4.1.0 sum patch\nplugin\noptions lazy-pages-external tmpfs-builtin-tar\n", true, false, nil},
		{"no criu", "4.2.1 sum patch\nplugin\noptions lazy-pages-external tmpfs-builtin-tar\n", false, false, nil},
		{"no stamp", "", true, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv(EnvCriuDir, dir)
			if c.stamp != "" {
				if err := os.WriteFile(filepath.Join(dir, ".stamp"), []byte(c.stamp), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if c.criu {
				if err := os.WriteFile(filepath.Join(dir, "criu"), nil, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			b := installedBuild(check)
			if (b.Path != "") != c.path {
				t.Fatalf("build path %q, want one: %v", b.Path, c.path)
			}
			if got := b.dumpConf(); !slices.Equal(got, c.conf) {
				t.Fatalf("dump configuration %q, want %q", got, c.conf)
			}
			if c.path && !slices.Contains(b.Options, "lazy-pages-external") {
				t.Fatalf("options %q lack lazy-pages-external", b.Options)
			}
		})
	}
}
