package fds

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The helper modes run in a re-executed test binary: closing descriptors
// and exiting are what is under test, and neither may happen to the test
// process itself.
const (
	helperCommand = "fds-test-helper"
	closeCommand  = "fds-test-close"
)

type helperConfig struct{ Keep int }

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case helperCommand:
			var cfg helperConfig
			if !HelperArgsKeeping(helperCommand, &cfg, func() int { return cfg.Keep }) {
				os.Exit(3)
			}
			report(3, 4, 5)
			os.Exit(0)
		case closeCommand:
			// A descriptor of the process's own, opened close-on-exec
			// as Go opens every file, must survive.
			own, err := os.Open("/dev/null")
			if err != nil {
				os.Exit(4)
			}
			CloseInherited(2)
			report(3, 4, int(own.Fd()))
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// report prints, for each descriptor, the inode it is open on or "closed".
func report(fds ...int) {
	var out []string
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			out = append(out, "closed")
		} else {
			out = append(out, fmt.Sprint(st.Ino))
		}
	}
	fmt.Println(strings.Join(out, " "))
}

// inheriting runs the test binary with args, passing it files as
// descriptors 3 on (without close-on-exec, as any inherited descriptor),
// and returns what it reported.
func inheriting(t *testing.T, files []*os.File, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.ExtraFiles = files
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

func inode(t *testing.T, f *os.File) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(st.Ino)
}

func tempFiles(t *testing.T, n int) []*os.File {
	t.Helper()
	var files []*os.File
	for range n {
		f, err := os.CreateTemp(t.TempDir(), "fd")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files = append(files, f)
	}
	return files
}

// Inherited descriptors above keep are closed; those at or below it, and
// the process's own close-on-exec ones, stay open.
func TestCloseInherited(t *testing.T) {
	files := tempFiles(t, 2)
	got, err := inheriting(t, files, closeCommand)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(got)
	if len(fields) != 3 || fields[0] != "closed" || fields[1] != "closed" || fields[2] == "closed" {
		t.Errorf("after CloseInherited(2), descriptors 3, 4 and the process's own are %q, want closed, closed and open", got)
	}
}

// The helper's keep is asked after its configuration is decoded, so a
// helper passed descriptors of its own keeps as many as it was told.
func TestHelperArgsKeepingKeepsWhatTheConfigurationSays(t *testing.T) {
	files := tempFiles(t, 3)
	for keep, want := range map[int]string{
		3: inode(t, files[0]) + " closed closed",
		4: inode(t, files[0]) + " " + inode(t, files[1]) + " closed",
	} {
		cfg, _ := json.Marshal(helperConfig{Keep: keep})
		got, err := inheriting(t, files, helperCommand, string(cfg))
		if err != nil {
			t.Fatalf("keep %d: %v", keep, err)
		}
		if got != want {
			t.Errorf("keep %d: descriptors 3, 4, 5 are %q, want %q", keep, got, want)
		}
	}
}

// A configuration that does not decode ends the helper with status 2.
func TestHelperArgsBadConfigurationExits2(t *testing.T) {
	_, err := inheriting(t, nil, helperCommand, "{not json")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("helper with a bad configuration: %v, want exit status 2", err)
	}
}

// Another command, or too few arguments, is not the helper's: HelperArgs
// says so and leaves the configuration and the descriptors alone.
func TestHelperArgsOtherCommand(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// Inherited-looking: without close-on-exec.
	if _, err := unix.FcntlInt(w.Fd(), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	saved := os.Args
	defer func() { os.Args = saved }()
	for _, args := range [][]string{
		{"tclone", "create", `{"Keep": 7}`},
		{"tclone", helperCommand},
		{"tclone"},
	} {
		os.Args = args
		cfg := helperConfig{Keep: -1}
		if HelperArgs(helperCommand, &cfg, 0) {
			t.Errorf("HelperArgs(%q) with argv %q = true", helperCommand, args)
		}
		if cfg.Keep != -1 {
			t.Errorf("argv %q: the configuration was decoded: %+v", args, cfg)
		}
	}
	if _, err := unix.FcntlInt(w.Fd(), unix.F_GETFD, 0); err != nil {
		t.Error("an inherited descriptor was closed by a call that was not the helper's")
	}
}
