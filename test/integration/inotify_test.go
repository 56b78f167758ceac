package integration

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const inotifyDir = "/var/tmp/inotify"

// inotifyEvents reads how many events the container's inotify-unlinked
// has read so far.
func inotifyEvents(t *testing.T, ctr string) int {
	t.Helper()
	return inotifyEventsIn(t, ctr, inotifyDir)
}

func inotifyEventsIn(t *testing.T, ctr, dir string) int {
	t.Helper()
	var n int
	eventually(t, 10*time.Second, "inotify events of "+ctr, func() error {
		r := podmanTry(t, "exec", ctr, "cat", dir+"/events")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		var err error
		n, err = strconv.Atoi(strings.TrimSpace(r.stdout))
		return err
	})
	return n
}

// requireNoLinkRemap fails if CRIU left a link-remap file (its hard link to
// a file without a name) in a directory of the container.
func requireNoLinkRemap(t *testing.T, ctr, dir string) {
	t.Helper()
	out := podman(t, "exec", ctr, "ls", "-a", dir)
	if strings.Contains(out, "link_remap") {
		t.Errorf("%s has CRIU's link-remap file left in %s: %s", ctr, dir, out)
	}
}

// A watch on a file its process has deleted (still open) cannot be dumped
// by CRIU from an overlay root: it cannot reopen the file by handle there,
// and there is no path to find. The fork says so in tclone's words, and
// the source runs on untouched.
func TestForkInotifyOnUnlinkedFileIsExplained(t *testing.T) {
	requireStack(t)
	src := name(t, "inotify")
	podman(t, "run", "-d", "--name", src, "-v", workloadBin()+":/workload:ro", busybox,
		"/workload", "inotify-unlinked", "--dir", inotifyDir)
	eventually(t, 10*time.Second, "the watch set up", func() error {
		if n := inotifyEvents(t, src); n < 3 {
			return fmt.Errorf("%d events", n)
		}
		return nil
	})
	r := forkCLI(t, src)
	if r.code == 0 {
		t.Fatal("this CRIU forks a watch on a deleted file: check that the sibling's watch still reports, and update this test and the README's limits")
	}
	for _, want := range []string{"Can't dump that handle", "inotify or fanotify watch", "deleted", "restart the watching program"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the refusal does not say %q: %s", want, r.stderr)
		}
	}
	before := inotifyEvents(t, src)
	eventually(t, 10*time.Second, "events in the source", func() error {
		if n := inotifyEvents(t, src); n <= before+5 {
			return fmt.Errorf("%d events, %d after the fork", n, before)
		}
		return nil
	})
	requireNoLinkRemap(t, src, inotifyDir)
	if got := len(siblingsOf(t, src)); got != 0 {
		t.Fatalf("a failed fork left %d siblings", got)
	}
	// CRIU failed after the twin plugin had cloned the source (twins are
	// parked only once the tree runs again): the twins it let go are
	// reaped by the failed fork itself, not left to tclone gc.
	if tw := podmanTwins(t, src); len(tw) > 0 {
		t.Errorf("the failed fork left twins in the source (state pid): %v", tw)
	}
	requireNoLeftovers(t)
}

// A file open under a name that was removed while another hard link to it
// remains has no path CRIU could record: the fork links it back (CRIU's
// link remap) in the frozen window. The sibling's descriptor is its copy of
// the same file, still one file with the other link, and neither root keeps
// the link-remap file.
func TestForkOpenFileWithoutItsName(t *testing.T) {
	requireStack(t)
	src := name(t, "lremap")
	podman(t, "run", "-d", "--name", src, busybox, "sh", "-c",
		`mkdir -p /var/tmp/lr; echo hello > /var/tmp/lr/a; exec 3<>/var/tmp/lr/a; ln /var/tmp/lr/a /var/tmp/lr/b; rm /var/tmp/lr/a; `+counterScript)
	readCounter(t, src)
	r := forkCLI(t, src)
	if r.code != 0 {
		t.Fatalf("fork of a process holding a file open under a removed name: exit %d: %s", r.code, r.stderr)
	}
	sib := src + "-fork-1"
	if c := readCounter(t, sib); c == 0 {
		t.Fatal("the sibling does not count")
	}
	// Written through the sibling's descriptor, read through its link.
	podman(t, "exec", sib, "sh", "-c", "echo sibling >> /proc/1/fd/3")
	if got := podman(t, "exec", sib, "cat", "/var/tmp/lr/b"); got != "hello\nsibling" {
		t.Errorf("the sibling's descriptor and its link are not one file: b holds %q", got)
	}
	if got := podman(t, "exec", src, "cat", "/var/tmp/lr/b"); got != "hello" {
		t.Errorf("the sibling's write reached the source: %q", got)
	}
	requireNoLinkRemap(t, src, "/var/tmp/lr")
	requireNoLinkRemap(t, sib, "/var/tmp/lr")
	requireNoLeftovers(t)
}

// A watch on a file of the container's overlay root, outside the few
// directories CRIU searches on its own: CRIU cannot reopen the file by its
// handle there, and finds it through the irmap cache tclone leaves it. The
// sibling's watch reports writes to its copy of the file.
func TestForkInotifyOnOverlayFile(t *testing.T) {
	requireStack(t)
	const dir = "/srv/app"
	src := name(t, "watch")
	podman(t, "run", "-d", "--name", src, "-v", workloadBin()+":/workload:ro", busybox,
		"/workload", "inotify-unlinked", "--keep-name", "--dir", dir)
	eventually(t, 10*time.Second, "the watch set up", func() error {
		if n := inotifyEventsIn(t, src, dir); n < 3 {
			return fmt.Errorf("%d events", n)
		}
		return nil
	})
	r := forkCLI(t, "--format", "json", src)
	if r.code != 0 {
		t.Fatalf("fork of a process watching a file: exit %d: %s", r.code, r.stderr)
	}
	var out []struct{ Name string }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out) != 1 {
		t.Fatalf("fork output %q: %v", r.stdout, err)
	}
	sib := out[0].Name
	first := inotifyEventsIn(t, sib, dir)
	eventually(t, 10*time.Second, "events in the sibling", func() error {
		if n := inotifyEventsIn(t, sib, dir); n <= first+5 {
			return fmt.Errorf("%d events, %d right after the fork", n, first)
		}
		return nil
	})
	var st struct {
		InotifyFd int `json:"inotify_fd"`
		Wd        int `json:"wd"`
	}
	if err := json.Unmarshal([]byte(podman(t, "exec", sib, "cat", dir+"/inotify.json")), &st); err != nil {
		t.Fatal(err)
	}
	fdinfo := podman(t, "exec", sib, "cat", fmt.Sprintf("/proc/1/fdinfo/%d", st.InotifyFd))
	if !strings.Contains(fdinfo, fmt.Sprintf("inotify wd:%x ", st.Wd)) {
		t.Errorf("the sibling's inotify descriptor has no watch %d:\n%s", st.Wd, fdinfo)
	}
	before := inotifyEventsIn(t, src, dir)
	eventually(t, 10*time.Second, "events in the source", func() error {
		if n := inotifyEventsIn(t, src, dir); n <= before+5 {
			return fmt.Errorf("%d events, %d after the fork", n, before)
		}
		return nil
	})
	requireNoLeftovers(t)
}
