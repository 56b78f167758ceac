package memuse

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A tree is measured with its children; a process alone has PSS at most
// its RSS.
func TestTree(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 5 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("the shell's child never showed")
		}
		u, err := Tree(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if u.Processes == 2 {
			if u.RssKiB <= 0 || u.PssKiB <= 0 || u.PssKiB > u.RssKiB {
				t.Fatalf("usage %+v", u)
			}
			break
		}
	}
	self, err := Tree(os.Getpid())
	if err != nil || self.Processes < 1 {
		t.Fatalf("%+v %v", self, err)
	}
	if _, err := Tree(1 << 30); err == nil {
		t.Fatal("a process that does not exist was measured")
	}
}

// Memory a process dirtied and maps alone is its private dirty memory; a
// process's figures are its own, and the tree's are their sum.
func TestProcessPrivateDirty(t *testing.T) {
	before, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const size = 16 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < size; i += 4096 {
		mem[i] = 1
	}
	after, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after.PrivateDirtyKiB - before.PrivateDirtyKiB; got < size>>10 {
		t.Fatalf("private dirty grew by %d KiB after dirtying %d KiB", got, size>>10)
	}
	if after.Processes != 1 || after.PrivateDirtyKiB > after.RssKiB {
		t.Fatalf("one process: %+v", after)
	}
	if _, err := Process(1 << 30); err == nil {
		t.Fatal("a process that does not exist was measured")
	}
}
