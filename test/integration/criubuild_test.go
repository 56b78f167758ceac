package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
)

// tclone's build of CRIU reads its tasks' smaps ahead of their dumps
// (--smaps-read-ahead): the capture's log says so for every process of
// the tree, and no read-ahead was thrown away (the frozen tree's
// mappings did not change between the read and the dump). Its twin
// plugin makes the twins of the whole tree side by side, in one batch.
func TestCaptureReadsAheadAndTwinsSideBySide(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "smaps")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c", "sleep 100000 & sleep 100000 & touch /ready; wait")
	eventually(t, 30*time.Second, "the source's processes started", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})

	log := planDumpLog(t, src, "copy")
	// sh and its two sleeps.
	if want := "smaps-ahead: Reading the smaps of 3 tasks ahead"; !strings.Contains(string(log), want) {
		t.Errorf("the capture's CRIU log does not say %q", want)
	}
	if strings.Contains(string(log), "smaps were read ahead: read again") {
		t.Errorf("the capture read a frozen task's smaps again:\n%s", log)
	}

	log = planDumpLog(t, src, "twin")
	if want := "tclone twin: 3 twins of 3 processes side by side"; !strings.Contains(string(log), want) {
		t.Errorf("the twin capture's CRIU log does not say %q:\n%s", want, log)
	}
}

// planDumpLog makes a plan of src with --memory memory and returns its
// CRIU dump log, at debug level (a capture's CRIU logs only warnings and
// errors otherwise); the plan goes at the test's end.
func planDumpLog(t *testing.T, src, memory string) []byte {
	t.Helper()
	r := run(t, time.Minute, tcloneBin(), "--log-level", "debug", "fork", "--plan-only", "--memory", memory, containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only --memory %s: %s", memory, r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// tclone's build of CRIU dumps a directory that several processes work in
// once, under one id (file-ids-dirs.patch), where stock CRIU dumps every
// process's cwd and root again: processes in distinct directories, two of
// them sharing one, and one in a bind mount's directory named like one of
// the image's (/srv/tmp and /tmp), each keep their own in the sibling,
// with copied memory and with twins. The capture's images hold each
// directory once.
func TestForkKeepsEveryWorkingDirectory(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "cwd")
	vol := t.TempDir()
	if err := os.Mkdir(filepath.Join(vol, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	// "/srv/tmp" is a directory of the bind mount; "/tmp" is the image's.
	script := "mkdir -p /w/a /w/b; " +
		"(cd /w/a && exec sleep 100001) & (cd /w/b && exec sleep 100002) & (cd /w/b && exec sleep 100003) & " +
		"(cd /srv/tmp && exec sleep 100004) & (cd /tmp && exec sleep 100005) & " +
		"touch /ready; cd /w; wait"
	podman(t, "run", "-d", "--name", src, "-v", vol+":/srv", busybox, "sh", "-c", script)
	eventually(t, 30*time.Second, "the source's processes started", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})
	cwds := func(c string) string {
		t.Helper()
		// Each sleep's argument and its cwd, and the shell's.
		return podman(t, "exec", c, "sh", "-c",
			`for p in /proc/[0-9]*; do a=$(tr '\0' ' ' <$p/cmdline); case "$a" in sleep*) echo "$a: $(readlink $p/cwd) $(readlink $p/root)";; "sh -c mkdir"*) echo "the shell: $(readlink $p/cwd) $(readlink $p/root)";; esac; done | sort`)
	}
	want := cwds(src)
	for _, w := range []string{"sleep 100001 : /w/a /", "sleep 100003 : /w/b /", "sleep 100004 : /srv/tmp /", "sleep 100005 : /tmp /", "the shell: /w /"} {
		if !strings.Contains(want, w) {
			t.Fatalf("the source is not as the test made it: no %q in\n%s", w, want)
		}
	}
	// One file entry for each directory, whoever works in it: the shell's
	// and the sleeps' root (/), /w/b of two sleeps.
	names := map[string]int{}
	for _, f := range planFiles(t, src) {
		if r := f.GetReg(); r != nil {
			names[r.GetName()]++
		}
	}
	for _, dir := range []string{"/", "/w", "/w/a", "/w/b", "/srv/tmp", "/tmp"} {
		if names[dir] != 1 {
			t.Errorf("the capture's images hold %d entries of %s, want 1 (all: %v)", names[dir], dir, names)
		}
	}
	for _, memory := range []string{"copy", "twin"} {
		sib := src + "-" + memory
		t.Cleanup(func() { podmanTry(t, "rm", "-f", sib) })
		if r := forkCLI(t, "--memory", memory, "--name", sib, src); r.code != 0 {
			t.Fatalf("fork --memory %s: exit %d: %s", memory, r.code, r.stderr)
		}
		if got := cwds(sib); got != want {
			t.Errorf("--memory %s: the sibling's processes work in\n%s\nwant\n%s", memory, got, want)
		}
	}
}

// planFiles makes a plan of src and returns the entries of its files.img.
func planFiles(t *testing.T, src string) []*fdinfo.FileEntry {
	t.Helper()
	r := run(t, time.Minute, tcloneBin(), "fork", "--plan-only", containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) })
	in, err := os.Open(filepath.Join(planDir, "images", "files.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(&fdinfo.FileEntry{})
	if err != nil {
		t.Fatalf("decoding the plan's files.img: %v", err)
	}
	var files []*fdinfo.FileEntry
	for _, e := range img.Entries {
		files = append(files, e.Message.(*fdinfo.FileEntry))
	}
	return files
}
