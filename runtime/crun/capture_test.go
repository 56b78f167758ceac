package crun

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCaptureArgs(t *testing.T) {
	got := Capture{TCPEstablished: true, ExtUnixSk: true, ShellJob: true, FileLocks: true}.Args()
	want := Args{"--tcp-established", "--ext-unix-sk", "--shell-job", "--file-locks"}
	if !slices.Equal(got, want) {
		t.Fatalf("Args = %q, want %q", got, want)
	}
	if got := (Capture{}).Args(); len(got) != 0 {
		t.Fatalf("no option, got %q", got)
	}
}

func TestRestoreArgs(t *testing.T) {
	got := Restore{ID: "sib", ImagePath: "/i", WorkPath: "/w", Bundle: "/b", Detach: true, ConsoleSocket: "/c",
		Capture: Capture{FileLocks: true}, LSMProfile: "p"}.Args()
	want := Args{"--image-path", "/i", "--work-path", "/w", "--bundle", "/b", "--detach", "--console-socket", "/c", "--file-locks", "--lsm-profile", "p", "sib"}
	if !slices.Equal(got, want) {
		t.Fatalf("Args = %q\nwant %q", got, want)
	}
}

func TestCRIUConfig(t *testing.T) {
	dir := t.TempDir()
	env, err := CRIUConfig(dir, CRIUTCPClose)
	if err != nil {
		t.Fatal(err)
	}
	path, ok := strings.CutPrefix(env, "CRIU_CONFIG_FILE=")
	if !ok || filepath.Dir(path) != dir {
		t.Fatalf("env %q", env)
	}
	if data, _ := os.ReadFile(path); string(data) != "tcp-close\n" {
		t.Fatalf("config %q", data)
	}
}
