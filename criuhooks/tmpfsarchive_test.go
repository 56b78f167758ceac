package criuhooks

import (
	"bytes"
	"compress/gzip"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tmpfsArchiveMain runs criu/tmpfs-archive.c on a directory, its archive
// to standard output; it exits with tmpfs_archive's answer (2 for -1).
const tmpfsArchiveMain = `#include <fcntl.h>
#include <stdio.h>
#include "tmpfs-archive.h"
int main(int argc, char **argv)
{
	char why[256];
	int ret;

	if (argc != 2)
		return 3;
	ret = tmpfs_archive(open(argv[1], O_RDONLY | O_DIRECTORY), 1, why, sizeof(why));
	if (ret)
		fprintf(stderr, "%s\n", why);
	return ret < 0 ? 2 : ret;
}
`

// criuTarArgs is the command line criu's tmpfs_dump runs (criu/
// filesystems.c), the directory last.
var criuTarArgs = []string{"--create", "--gzip", "--no-unquote", "--no-wildcards", "--one-file-system",
	"--check-links", "--preserve-permissions", "--sparse", "--numeric-owner", "--directory"}

// buildTmpfsArchive compiles criu/tmpfs-archive.c (which tclone's build of
// CRIU links, tmpfs-builtin-tar.patch) into a command.
func buildTmpfsArchive(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.c"), []byte(tmpfsArchiveMain), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tmpfs-archive")
	out, err := exec.Command("gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-Icriu", "-o", bin,
		filepath.Join(dir, "main.c"), "criu/tmpfs-archive.c").CombinedOutput()
	if err != nil {
		t.Fatalf("compiling criu/tmpfs-archive.c (gcc comes with the set-up, hack/build-criu.sh): %v\n%s", err, out)
	}
	return bin
}

func gunzip(t *testing.T, what string, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	out, err := io.ReadAll(zr) // checks the CRC and the length
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

// makeTarTree fills dir with every kind of entry tar records, and some it
// records in more than one block.
func makeTarTree(t *testing.T, dir string) {
	t.Helper()
	long := strings.Repeat("l", 150)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(s string) string { return filepath.Join(dir, s) }
	must(os.MkdirAll(p("a/b/c"), 0o755))
	must(os.Mkdir(p("private"), 0o700))
	must(os.WriteFile(p("a/f"), []byte("hi\n"), 0o644))
	must(unix.Chmod(p("a/f"), 0o4755))
	must(os.Link(p("a/f"), p("a/hard")))
	must(os.Link(p("a/f"), p("a/b/c/hard2")))
	must(os.Symlink("../f", p("a/b/sym")))
	must(os.Mkdir(p(long), 0o755))
	must(os.WriteFile(p(long+"/"+long), []byte("a long name\n"), 0o600))
	must(os.Symlink(long+"/"+long, p("longlink")))
	must(os.Link(p(long+"/"+long), p("hard-to-long")))
	must(unix.Mkfifo(p("fifo"), 0o640))
	must(unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(p("loop"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 0))))
	must(os.Chown(p("a/f"), 3000000, 12)) // beyond tar's 7 octal digits
	must(os.Chown(p("private"), 1000, 1000))
	big := make([]byte, 200000) // more than one stored deflate block
	rand.New(rand.NewSource(1)).Read(big)
	must(os.WriteFile(p("big"), big, 0o644))
	must(os.WriteFile(p("block"), bytes.Repeat([]byte{'x'}, 512), 0o644))
	must(os.WriteFile(p("empty"), nil, 0o644))
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(err)
	must(unix.Bind(fd, &unix.SockaddrUnix{Name: p("socket")})) // tar leaves sockets out
	unix.Close(fd)
	// Hard links tar records as links (regular files, symbolic links) and
	// those it archives again under each name (the rest).
	must(os.Link(p("socket"), p("socket2")))
	must(os.Link(p("fifo"), p("fifo2")))
	must(os.Link(p("null"), p("null2")))
	must(os.Link(p("a/b/sym"), p("sym2")))
	// A long name with a long target, a link and a hard link.
	must(os.Symlink(long+"/"+long, p(long+"/"+strings.Repeat("s", 120))))
	must(os.Link(p(long+"/"+long), p(long+"/"+strings.Repeat("h", 130))))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(os.Chtimes(p("a/b"), old, old))
	must(unix.Lutimes(p("a/b/sym"), []unix.Timeval{unix.NsecToTimeval(old.UnixNano()), unix.NsecToTimeval(old.UnixNano())}))
}

// tclone's build of CRIU archives a tmpfs itself (--tmpfs-builtin-tar):
// unzipped, its archive is byte for byte the tar stream of criu's own tar
// command line, and a valid gzip file; what it cannot write as tar would
// (a sparse file), it leaves to tar and says why.
func TestTmpfsArchiveIsTarsStream(t *testing.T) {
	bin := buildTmpfsArchive(t)
	for _, tree := range []string{"empty", "every kind"} {
		t.Run(tree, func(t *testing.T) {
			dir := t.TempDir()
			if tree != "empty" {
				makeTarTree(t, dir)
			}
			ours, err := exec.Command(bin, dir).Output()
			if err != nil {
				t.Fatalf("tmpfs-archive: %v %s", err, stderrOf(err))
			}
			theirs, err := exec.Command("tar", append(criuTarArgs, dir, ".")...).Output()
			if err != nil {
				t.Fatalf("tar: %v %s", err, stderrOf(err))
			}
			o, g := gunzip(t, "tmpfs-archive's archive", ours), gunzip(t, "tar's archive", theirs)
			if !bytes.Equal(o, g) {
				at := 0
				for at < len(o) && at < len(g) && o[at] == g[at] {
					at++
				}
				t.Fatalf("the archive differs from tar's at byte %d (header of block %d): %d bytes, tar's %d", at, at/512, len(o), len(g))
			}
			cmd := exec.Command("tar", "-tz", "-f", "-")
			cmd.Stdin = bytes.NewReader(ours)
			names, err := cmd.Output()
			if err != nil {
				t.Fatalf("tar cannot list the archive: %v %s", err, stderrOf(err))
			}
			if tree != "empty" && !strings.Contains(string(names), "./a/b/c/hard2") {
				t.Fatalf("tar lists %q", names)
			}
		})
	}
	t.Run("sparse", func(t *testing.T) {
		dir := t.TempDir()
		f, err := os.Create(filepath.Join(dir, "sparse"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(16 << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		_, err = exec.Command(bin, dir).Output()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(ee.Stderr), "./sparse is sparse") {
			t.Fatalf("a sparse file: %v %s, want tmpfs_archive to leave it to tar (1) and say why", err, stderrOf(err))
		}
	})
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
