package crun

import (
	"reflect"
	"testing"
)

func TestGlobalArgs(t *testing.T) {
	if args := (Global{}).Args(); len(args) != 0 {
		t.Fatalf("no flags rendered as %v", args)
	}
	g := Global{Root: "/r", Log: "/l", LogFormat: "json", LogLevel: "debug", Debug: true,
		SystemdCgroup: true, CgroupManager: "cgroupfs", Rootless: "false"}
	want := []string{"--debug", "--log=/l", "--log-format=json", "--log-level=debug", "--root=/r",
		"--systemd-cgroup", "--cgroup-manager=cgroupfs", "--rootless=false"}
	if got := g.Args(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
