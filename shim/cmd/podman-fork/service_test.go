package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --url, --connection and --ssh-identity say where a fork connects: one
// place, with an ssh key only for ssh.
func TestDestination(t *testing.T) {
	dir := t.TempDir()
	connections := filepath.Join(dir, "podman-connections.json")
	if err := os.WriteFile(connections, []byte(`{"Connection":{"Connections":{
		"build":{"URI":"ssh://u@build/run/tclone/tclone.sock","Identity":"/keys/build"},
		"local":{"URI":"unix:///run/tclone/tclone.sock"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PODMAN_CONNECTIONS_CONF", connections)
	// No host containers.conf: its connections are not the test's.
	empty := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONTAINERS_CONF", empty)

	for _, c := range []struct {
		url, connection, identity string
		want                      target
	}{
		{"", "", "", target{}},
		{"unix:///x.sock", "", "", target{url: "unix:///x.sock"}},
		{"ssh://u@h/s.sock", "", "/k", target{url: "ssh://u@h/s.sock", identity: "/k"}},
		{"", "build", "", target{url: "ssh://u@build/run/tclone/tclone.sock", identity: "/keys/build"}},
		{"", "build", "/mine", target{url: "ssh://u@build/run/tclone/tclone.sock", identity: "/mine"}},
		{"", "local", "", target{url: "unix:///run/tclone/tclone.sock"}},
	} {
		got, err := destination(c.url, c.connection, c.identity)
		if err != nil || got != c.want {
			t.Errorf("destination(%q, %q, %q) = %+v, %v; want %+v", c.url, c.connection, c.identity, got, err, c.want)
		}
	}
	for _, c := range []struct{ url, connection, identity, want string }{
		{"unix:///x.sock", "build", "", "--url unix:///x.sock and --connection build both say where to connect: give one"},
		{"", "nowhere", "", `--connection nowhere: connection "nowhere" not found (see podman system connection ls)`},
		{"unix:///x.sock", "", "/k", "--ssh-identity is for an ssh:// --url or --connection"},
		{"", "", "/k", "--ssh-identity is for an ssh:// --url or --connection"},
	} {
		if _, err := destination(c.url, c.connection, c.identity); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("destination(%q, %q, %q): %v, want %q", c.url, c.connection, c.identity, err, c.want)
		}
	}
}
