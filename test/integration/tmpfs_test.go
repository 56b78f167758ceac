package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/shim/podmanfork"
)

// tmpfsTree fills /scratch with every kind of entry tar records (hard
// links, long names and link targets, a fifo, devices, an owner beyond
// tar's octal digits, an old time), and /sparse with a sparse file.
const tmpfsTree = `set -e; cd /scratch; mkdir -p a/b/c private; echo hi > a/f; ` +
	`ln a/f a/hard; ln a/f a/b/c/hard2; ln -s ../f a/b/sym; ` +
	`L=$(printf 'l%.0s' $(seq 150)); mkdir "$L"; echo long > "$L/$L"; ln -s "$L/$L" longlink; ` +
	`mkfifo fifo; mknod null c 1 3; mknod loop b 7 0; chown 3000000:12 a/f; chmod 4755 a/f; chown 1000:1000 private; chmod 700 private; ` +
	`head -c 200000 /dev/urandom > big; : > empty; touch -d '2001-02-03 04:05:06' a/b; ` +
	`dd if=/dev/zero of=/sparse/file bs=1 count=1 seek=16777216 2>/dev/null; echo filled > /scratch/ready; ` +
	`exec sleep 100000`

// tmpfsListing is every entry of the container's tmpfs mounts under test
// (and /dev's but its directories, mount points made anew in a sibling):
// name, type and mode, owner, size, link count,
// device numbers, and the time of all but symbolic links; then the
// regular files' digests.
const tmpfsListing = `for d in /scratch /sparse /dev; do cd $d; t=; [ $d = /dev ] && t='! -type d'; find . -xdev $t | sort | while read f; do ` +
	`if [ -L "$f" ]; then stat -c "$d/%n %f %u %g %s %h -> %N" "$f"; else stat -c "$d/%n %f %u %g %s %h %t %T %Y" "$f"; fi; done; ` +
	`find . -xdev -type f | sort | xargs -r md5sum; done`

// tclone's build of CRIU archives the source's tmpfs mounts itself, while
// the source is held, instead of running tar and gzip for each
// (--tmpfs-builtin-tar): the capture's log says so, its images hold the
// archives it wrote (stored gzip blocks, where gzip would compress), and
// siblings restored by stock CRIU, with twins and with copied pages, have
// every entry as the source has it. A tmpfs with a sparse file is left to
// tar, and says why.
func TestPodmanForkTmpfsContents(t *testing.T) {
	requireStack(t)
	requireTwins(t)
	src := name(t, "tmpfs")
	podman(t, "run", "-d", "--name", src, "--cap-add", "MKNOD,CHOWN,FOWNER", "--tmpfs", "/scratch:rw,size=64m,mode=1777",
		"--tmpfs", "/sparse:rw,size=64m", busybox, "sh", "-c", tmpfsTree)
	eventually(t, 30*time.Second, "the source's tmpfs filled", func() error {
		if r := podmanTry(t, "exec", src, "cat", "/scratch/ready"); r.code != 0 {
			return errorf("not yet: %s", r.stderr)
		}
		return nil
	})
	want := podman(t, "exec", src, "sh", "-c", tmpfsListing)
	if !strings.Contains(want, "/scratch/./a/b/c/hard2 89ed 3000000 12 3 3 ") || !strings.Contains(want, "/sparse/./file ") {
		t.Fatalf("the source's tmpfs is not as the test made it:\n%s", want)
	}

	// The capture alone: its images and its CRIU's log (at debug level,
	// which has CRIU's info lines).
	r := run(t, time.Minute, tcloneBin(), "--log-level", "debug", "fork", "--plan-only", "--memory", "copy", containerID(t, src))
	if r.code != 0 {
		t.Fatalf("plan-only: %s", r.stderr)
	}
	planDir := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { removePlan(planDir) }) // a failure below leaves it
	log, err := os.ReadFile(filepath.Join(planDir, "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"/scratch without tar", "/dev without tar", "/sparse with tar: ./file is sparse"} {
		if !strings.Contains(string(log), m) {
			t.Errorf("the capture's CRIU log does not say %q", m)
		}
	}
	archives, _ := filepath.Glob(filepath.Join(planDir, "images", "tmpfs-dev-*.tar.gz.img"))
	stored := 0
	for _, a := range archives {
		b, err := os.ReadFile(a)
		if err != nil || len(b) < 11 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s is no gzip file: %v", a, err)
		}
		if b[10]&6 == 0 { // the first deflate block is stored: tclone's CRIU wrote it
			stored++
		}
	}
	if stored == 0 || stored != len(archives)-1 {
		t.Errorf("%d of the %d tmpfs archives were written by CRIU itself, want all but /sparse's", stored, len(archives))
	}
	removePlan(planDir)

	for _, memory := range []string{"twin", "copy"} {
		r := forkCLI(t, "--memory", memory, "--format", "json", src)
		if r.code != 0 {
			t.Fatalf("fork --memory %s: %s", memory, r.stderr)
		}
		var out []podmanfork.Result
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out) != 1 {
			t.Fatalf("fork --memory %s: %v %q", memory, err, r.stdout)
		}
		sib := out[0].Name
		if got := podman(t, "exec", sib, "sh", "-c", tmpfsListing); got != want {
			t.Errorf("--memory %s: the sibling's tmpfs mounts differ from the source's:\n%s", memory, lineDiff(want, got))
		}
		podman(t, "rm", "-f", "-t", "0", sib)
	}
	requireNoLeftovers(t)
}

// lineDiff lists the lines only one of a and b has.
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
