package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestServiceListenerRefusals(t *testing.T) {
	t.Setenv("LISTEN_PID", "")
	for _, c := range []struct{ url, want string }{
		{"ftp://host/x", "give unix:///PATH or tcp://HOST:PORT"},
		{"unix://relative.sock", "absolute path"},
		{"unix:///tmp/x.sock", "--group"},
	} {
		group := ""
		if strings.Contains(c.want, "--group") {
			group = "tct-no-such-group"
		}
		if ln, _, err := serviceListener(c.url, group); err == nil || !strings.Contains(err.Error(), c.want) {
			if ln != nil {
				ln.Close()
			}
			t.Errorf("%s: %v, want an error saying %q", c.url, err, c.want)
		}
	}
	if _, err := unixPath("tcp://x:1"); err == nil {
		t.Error("--podman-url tcp:// accepted")
	}
}

// A socket a live service answers on is never taken over; one left by a
// service that died is replaced; the socket is root's alone without --group.
func TestListenUnixStaleAndLive(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tclone.sock")
	live, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(path, ""); err == nil || !strings.Contains(err.Error(), "already listens") {
		t.Errorf("over a live service: %v", err)
	}
	// A dead service's socket file stays behind.
	live.(*net.UnixListener).SetUnlinkOnClose(false)
	live.Close()
	ln, err := listenUnix(path, "")
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	defer ln.Close()
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
}
