package memuse

import (
	"os"
	"os/exec"
	"testing"
	"time"
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
