package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/wptrack"
	"github.com/tclone/tclone/shim/podmanfork"
)

// branchStats creates branch name of src and returns its statistics.
func branchStats(t *testing.T, src, name string) podmanfork.BranchStats {
	t.Helper()
	var st podmanfork.BranchStats
	if err := json.Unmarshal([]byte(branchOK(t, "create", "--file-locks", "--print-stats", src, name)), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("branch %s: pause %.1f ms, %d KiB copied out of the twins, %d KiB from the last branch",
		name, st.SourcePauseMs, st.CopiedBytes>>10, st.FromBaseBytes>>10)
	return st
}

// requireBranchMemory starts a container from branch name and checks that
// its workload's memory is what the source's was at the branch.
func requireBranchMemory(t *testing.T, name string, at report) {
	t.Helper()
	ctr := uniqueName("brinc-start")
	branchOK(t, "start", "--name", ctr, name)
	t.Cleanup(func() { removeContainers(t, ctr) })
	got := workloadCmd(t, execIn(ctr), "probe", "--hash")
	if got.MemSHA256 != at.MemSHA256 || got.Tag != at.Tag || !got.MemVerified {
		t.Errorf("branch %s: memory hash %s tag %q (verified %v), want %s tag %q", name, got.MemSHA256, got.Tag, got.MemVerified, at.MemSHA256, at.Tag)
	}
}

// A second branch of a source copies out of its twins only what the
// source wrote since the first, and takes the rest from the first; its
// containers hold the source's memory as it was at the second branch. A
// fork between two branches changes nothing of that (a fork never reads
// the tracking), and a tracking whose holder was killed makes the next
// branch copy everything again, never take a stale page. A removed
// source's tracking goes with it.
func TestBranchIncremental(t *testing.T) {
	requireStack(t)
	branchStore(t)
	src, _, srcExec := workloadSource(t, "brinc", workspace, 64)
	id := podman(t, "inspect", "--format", "{{.Id}}", src)

	first := branchStats(t, src, "i1")
	if first.CopiedBytes < 64<<20 || first.FromBaseBytes != 0 {
		t.Fatalf("first branch: %d bytes copied, %d from a base; want all of the 64 MiB copied", first.CopiedBytes, first.FromBaseBytes)
	}
	// A fork between the branches.
	sib := uniqueName("brinc-fork")
	t.Cleanup(func() { removeContainers(t, sib) })
	if r := forkCLI(t, "--file-locks", "--name", sib, src); r.code != 0 {
		t.Fatalf("podman container fork: exit %d: %s", r.code, r.stderr)
	}
	workloadCmd(t, srcExec, "mutate", "--tag", "second", "--mem")
	at := workloadCmd(t, srcExec, "probe", "--hash")
	second := branchStats(t, src, "i2")
	if second.FromBaseBytes < 60<<20 || second.CopiedBytes > first.CopiedBytes/4 {
		t.Errorf("second branch: %d bytes copied, %d from the first; want most of the 64 MiB from the first", second.CopiedBytes, second.FromBaseBytes)
	}
	requireBranchMemory(t, "i2", at)

	// The tracking's holder dies: the next branch copies everything.
	var st wptrack.State
	b, err := os.ReadFile(filepath.Join("/run/tclone/track", strings.TrimSpace(id)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Holder.Pid <= 0 {
		t.Fatalf("the tracking's state: %s, %v", b, err)
	}
	if err := syscall.Kill(st.Holder.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	workloadCmd(t, srcExec, "mutate", "--tag", "third", "--mem")
	at = workloadCmd(t, srcExec, "probe", "--hash")
	third := branchStats(t, src, "i3")
	if third.FromBaseBytes != 0 {
		t.Errorf("third branch, after its holder was killed: %d bytes from a base, want none", third.FromBaseBytes)
	}
	requireBranchMemory(t, "i3", at)

	// And tracking starts again from there.
	workloadCmd(t, srcExec, "mutate", "--tag", "fourth", "--mem")
	at = workloadCmd(t, srcExec, "probe", "--hash")
	fourth := branchStats(t, src, "i4")
	if fourth.FromBaseBytes < 60<<20 {
		t.Errorf("fourth branch: %d bytes from the third, want most of the 64 MiB", fourth.FromBaseBytes)
	}
	requireBranchMemory(t, "i4", at)

	// A removed source leaves no tracking behind: its holder removes it.
	removeContainers(t, src)
	state := filepath.Join("/run/tclone/track", strings.TrimSpace(id))
	deadline := time.Now().Add(15 * time.Second)
	for _, err := os.Stat(state + ".json"); err == nil; _, err = os.Stat(state + ".json") {
		if time.Now().After(deadline) {
			t.Fatalf("%s.json outlived the source by 15 s", state)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(state + ".lock"); !os.IsNotExist(err) {
		t.Errorf("%s.lock after the source was removed: %v", state, err)
	}
}
