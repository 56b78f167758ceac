package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUModel  string `json:"cpu_model"`
	CPUs      int    `json:"cpus"`
	MemTotal  string `json:"mem_total"`
	Kernel    string `json:"kernel"`
	OS        string `json:"os"`
	Virt      string `json:"virtualization"`
	THP       string `json:"transparent_hugepages"`
	Cgroups   string `json:"cgroups"`
	Podman    string `json:"podman"`
	Crun      string `json:"crun"`
	Criu      string `json:"criu"`
	Conmon    string `json:"conmon"`
	Tclone    string `json:"tclone"`
	Go        string `json:"go"`
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

func readFirstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return firstLine(string(b))
}

func fieldOf(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func versionOf(ctx context.Context, bin string, args ...string) string {
	out, _, err := runCmd(ctx, bin, args...)
	if err != nil {
		return "unknown (" + firstLine(err.Error()) + ")"
	}
	return firstLine(out)
}

func describeMachine(ctx context.Context, t Tools) Machine {
	m := Machine{
		CPUModel: fieldOf("/proc/cpuinfo", "model name"),
		CPUs:     runtime.NumCPU(),
		MemTotal: memTotal(),
		THP:      readFirstLine("/sys/kernel/mm/transparent_hugepage/enabled"),
		Go:       runtime.Version(),
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
	}
	if v := fieldOf("/etc/os-release", "PRETTY_NAME"); v != "" {
		m.OS = v
	} else {
		for _, line := range strings.Split(string(must(os.ReadFile("/etc/os-release"))), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if dv := readFirstLine("/etc/debian_version"); dv != "" {
		m.OS += " (debian_version " + dv + ")"
	}
	if out, _, err := runCmd(ctx, "systemd-detect-virt", "--vm"); err == nil {
		m.Virt = "virtual machine: " + firstLine(out)
	} else if strings.Contains(fieldOf("/proc/cpuinfo", "flags"), "hypervisor") {
		m.Virt = "virtual machine (cpuinfo: hypervisor)"
	} else {
		m.Virt = "none detected"
	}
	if strings.Contains(readFirstLine("/proc/cmdline"), "firecracker") {
		m.Virt += " (Firecracker microVM)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		m.Cgroups = "v2 (unified)"
	} else if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		m.Cgroups = "v1 (hybrid, cgroup2 at /sys/fs/cgroup/unified)"
	} else {
		m.Cgroups = "v1"
	}
	m.Podman = versionOf(ctx, t.Podman, "--version")
	m.Crun = versionOf(ctx, "crun", "--version")
	m.Criu = strings.TrimPrefix(versionOf(ctx, t.Criu, "--version"), "Version: ")
	m.Conmon = versionOf(ctx, "conmon", "--version")
	m.Tclone = versionOf(ctx, t.Tclone, "--version")
	m.LoadStart = readFirstLine("/proc/loadavg")
	return m
}

func must(b []byte, _ error) []byte { return b }

// memTotal is MemTotal from /proc/meminfo in GiB.
func memTotal() string {
	v := strings.TrimSuffix(fieldOf("/proc/meminfo", "MemTotal"), " kB")
	var kib float64
	if _, err := fmt.Sscanf(v, "%f", &kib); err != nil || kib <= 0 {
		return v
	}
	return fmt.Sprintf("%.1f GiB", kib/1024/1024)
}
