package fork

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/runtime/criucheck"
	"github.com/tclone/tclone/runtime/forkopts"
)

// tclone's build of CRIU is used only for the host's CRIU version, only
// where its criu is installed, and is given only the options its stamp
// lists: a build from before the stamp listed them has lazy-pages-external
// alone, and no dump of it is configured with tmpfs-builtin-tar. A dump
// that keeps established TCP connections keeps their conntrack entries;
// every dump of a build that has them reads smaps ahead and polls for its
// tasks, with tclone's budget.
func TestInstalledBuildOptions(t *testing.T) {
	check := &criucheck.Result{Version: criucheck.Version(40201)}
	all := "4.2.1 sum patch\nplugin\noptions lazy-pages-external tmpfs-builtin-tar skip-conntrack smaps-read-ahead busy-wait\n"
	busy := fmt.Sprintf("busy-wait %d", criuhooks.BusyWaitMicros)
	for _, c := range []struct {
		name, stamp string
		criu        bool
		path        bool
		tcp         bool
		conf        []string
	}{
		{"options listed", all, true, true, false, []string{criuhooks.TmpfsBuiltinTar, criuhooks.SkipConntrack, criuhooks.SmapsReadAhead, busy}},
		{"established TCP kept", all, true, true, true, []string{criuhooks.TmpfsBuiltinTar, criuhooks.SmapsReadAhead, busy}},
		{"build without busy-wait", strings.Replace(all, " busy-wait", "", 1), true, true, false, []string{criuhooks.TmpfsBuiltinTar, criuhooks.SkipConntrack, criuhooks.SmapsReadAhead}},
		{"build without skip-conntrack", "4.2.1 sum patch\nplugin\noptions lazy-pages-external tmpfs-builtin-tar\n", true, true, false, []string{criuhooks.TmpfsBuiltinTar}},
		{"older stamp", "4.2.1 sum patch\nplugin\n", true, true, false, nil},
		{"other CRIU version", strings.Replace(all, "4.2.1", "4.1.0", 1), true, false, false, nil},
		{"no criu", all, false, false, false, nil},
		{"no stamp", "", true, false, false, nil},
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
			if got := b.dumpConf(forkopts.Dumped{TCPEstablished: c.tcp}); !slices.Equal(got, c.conf) {
				t.Fatalf("dump configuration %q, want %q", got, c.conf)
			}
			if c.path && !slices.Contains(b.Options, "lazy-pages-external") {
				t.Fatalf("options %q lack lazy-pages-external", b.Options)
			}
		})
	}
}

// Twins are taken only with a plugin built from this tclone's own sources
// (the stamp's second line): a plugin left from an older tclone may speak
// another version of the plugin's messages, which would fail every twin
// capture after its pause instead of choosing another way before it.
func TestTwinAvailableNeedsThisTclonesPlugin(t *testing.T) {
	check := &criucheck.Result{Version: criucheck.Version(40201), Kernel: "6.18.0", LazyPages: true, Path: "/usr/sbin/criu"}
	for _, c := range []struct {
		name, plugin string
		ok           bool
	}{
		{"this tclone's", criuhooks.TwinPluginStamp(), true},
		{"another tclone's", "0123456789abcdef", false},
		{"no plugin line", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv(EnvCriuDir, dir)
			if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "plugins", criuhooks.TwinPluginName), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			stamp := "4.2.1 sum patch\n" + c.plugin + "\noptions lazy-pages-external\n"
			if err := os.WriteFile(filepath.Join(dir, ".stamp"), []byte(stamp), 0o644); err != nil {
				t.Fatal(err)
			}
			_, ok, why := twinAvailable(check)
			if runtime.GOARCH != "amd64" {
				if ok || !strings.Contains(why, "x86-64 only") {
					t.Fatalf("twins on %s: %v (%s), want none", runtime.GOARCH, ok, why)
				}
				return
			}
			if ok != c.ok {
				t.Fatalf("twins available: %v (%s), want %v", ok, why, c.ok)
			}
			if !ok && !strings.Contains(why, "built from other sources than this tclone's") {
				t.Fatalf("refusal %q does not say the plugin is another tclone's", why)
			}
		})
	}
}

// A take that failed on a twin dead after the thaw lets auto capture again
// the old way; any other failure fails the capture, saying that the source
// runs on and what to do.
func TestTwinTakeErrors(t *testing.T) {
	var unfit *notTwinnable
	if err := takeError(fmt.Errorf("twin 7 of process 3: %w", criuhooks.ErrTwinGone)); !errors.As(err, &unfit) {
		t.Fatalf("a dead twin: %v, want a capture auto makes again", err)
	}
	for _, cause := range []error{
		&criuhooks.TwinError{Pid: 3, Why: "parking the twin 9: its setsid failed"},
		errors.New("process 5 of the images has no twin: CRIU's plugin did not make one"),
	} {
		err := takeError(cause)
		if errors.As(err, &unfit) || !errors.Is(err, cause) || !strings.Contains(err.Error(), "the source runs on: fork again, or with --memory lazy or copy") {
			t.Errorf("%v: %v, want a failure that says what to do", cause, err)
		}
	}
}

// A build that keeps its kernel probe cache in a directory of its own says
// where in its stamp, and a dump makes that directory: without it the build
// probes the kernel before every dump. A stamp without the field, or with
// a relative one, names none.
func TestInstalledBuildKerndatDir(t *testing.T) {
	check := &criucheck.Result{Version: criucheck.Version(40201)}
	for _, c := range []struct {
		field string // %s: the directory
		named bool
	}{
		{" RUNDIR=%s", true},
		{"", false},
		{" RUNDIR=run/x", false},
	} {
		cache := filepath.Join(t.TempDir(), "plans", ".criu")
		stamp := "4.2.1 sum patch" + strings.ReplaceAll(c.field, "%s", cache) + "\nplugin\n"
		dir := t.TempDir()
		t.Setenv(EnvCriuDir, dir)
		if err := os.WriteFile(filepath.Join(dir, ".stamp"), []byte(stamp), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "criu"), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		b := installedBuild(check)
		if got := b.KerndatDir == cache; got != c.named {
			t.Fatalf("stamp %q: kerndat directory %q, want %s named: %v", stamp, b.KerndatDir, cache, c.named)
		}
		b.keepKerndat()
		if st, err := os.Stat(cache); c.named != (err == nil) || err == nil && !st.IsDir() {
			t.Fatalf("stamp %q: after keepKerndat, %s: %v", stamp, cache, err)
		}
	}
}
