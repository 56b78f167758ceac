package ksm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/test/testenv"
)

func fakeSys(t *testing.T, s Settings) {
	t.Helper()
	dir := t.TempDir()
	old := SysDir
	SysDir = dir
	t.Cleanup(func() { SysDir = old })
	if err := write(s); err != nil {
		t.Fatal(err)
	}
}

func current(t *testing.T) Settings {
	t.Helper()
	s, err := read()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A young fork turns ksmd on and up, the host's settings saved once; they
// come back when the last young fork ages or its sibling is gone.
func TestTunerBoostsAndSettles(t *testing.T) {
	host := Settings{Run: 0, PagesToScan: 100, SleepMillisecs: 200}
	fakeSys(t, host)
	alive := map[string]bool{"a": true, "b": true}
	tu := Tuner{Dir: filepath.Join(t.TempDir(), "ksm"), Window: time.Minute, Alive: func(id string) bool { return alive[id] }}
	if next, err := tu.Settle(time.Now()); err != nil || next != 0 || current(t) != host {
		t.Fatalf("settle with nothing boosted: %v %v %+v", next, err, current(t))
	}
	if err := tu.Young("a"); err != nil {
		t.Fatal(err)
	}
	if got := current(t); got != Boosted {
		t.Fatalf("boosted to %+v, want %+v", got, Boosted)
	}
	// A second fork saves nothing new: the host's settings stay saved.
	if err := tu.Young("b"); err != nil {
		t.Fatal(err)
	}
	if next, err := tu.Settle(time.Now()); err != nil || next <= 0 || current(t) != Boosted {
		t.Fatalf("settle with young forks: %v %v %+v", next, err, current(t))
	}
	alive["a"] = false
	if next, _ := tu.Settle(time.Now()); next <= 0 {
		t.Fatal("settled while b was young")
	}
	if next, err := tu.Settle(time.Now().Add(2 * time.Minute)); err != nil || next != 0 {
		t.Fatalf("settle after the window: %v %v", next, err)
	}
	if got := current(t); got != host {
		t.Fatalf("settings after settling: %+v, want the host's %+v", got, host)
	}
	if m, _ := filepath.Glob(filepath.Join(tu.Dir, "young-*")); len(m) != 0 {
		t.Errorf("markers left: %v", m)
	}
}

// A host that scans faster than the boost keeps its rate.
func TestTunerKeepsAFasterHost(t *testing.T) {
	host := Settings{Run: 1, PagesToScan: 5000, SleepMillisecs: 10}
	fakeSys(t, host)
	tu := Tuner{Dir: filepath.Join(t.TempDir(), "ksm"), Window: time.Minute}
	if err := tu.Young("a"); err != nil {
		t.Fatal(err)
	}
	if got := current(t); got != host {
		t.Fatalf("a faster host slowed to %+v", got)
	}
}

// The mark is inherited across fork and exec.
func TestMarkSelfIsInherited(t *testing.T) {
	if err := Available(); err != nil {
		testenv.Missing(t, "no whole-process KSM here: %v", err)
	}
	testenv.NeedRoot(t, "marking a process mergeable")
	if err := MarkSelf(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "exec sleep 5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
		if strings.TrimSpace(string(comm)) == "sleep" || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ok, err := Marked(cmd.Process.Pid); err != nil || !ok {
		t.Fatalf("a child that exec'd twice is not marked: %v %v", ok, err)
	}
}

// Settings saved in an earlier boot are dropped, never written back over
// what the host set since (a reboot resets ksmd).
func TestSettingsOfAnEarlierBootAreDropped(t *testing.T) {
	fakeSys(t, Boosted)
	tu := Tuner{Dir: filepath.Join(t.TempDir(), "ksm"), Window: time.Minute}
	os.MkdirAll(tu.Dir, 0o700)
	if err := atomicfile.WriteJSON(filepath.Join(tu.Dir, savedFile), saved{Settings: Settings{PagesToScan: 1, SleepMillisecs: 1}, BootID: "another-boot"}, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tu.Settle(time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := current(t); got != Boosted {
		t.Fatalf("settings of another boot were written back: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(tu.Dir, savedFile)); !os.IsNotExist(err) {
		t.Fatal("settings of another boot were kept")
	}
}

func TestKeepsMergeAcrossExec(t *testing.T) {
	for release, want := range map[string]bool{"6.6.58": false, "6.7.0": true, "6.12.117+deb13-cloud-amd64": true, "7.3.4": true, "5.15.0": false, "junk": false} {
		if got := keepsMergeAcrossExec(release); got != want {
			t.Errorf("%s: %v, want %v", release, got, want)
		}
	}
}
