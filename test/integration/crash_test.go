package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/fork"
	"github.com/tclone/tclone/runtime/plan"
)

// hostStore is the state of the tclone under test: the installed one, at
// its default layout.
var hostStore = plan.Store{Layout: plan.DefaultLayout()}

// leftovers lists what tclone keeps on the host for forks in flight (plans,
// siblings' scratch, journal entries, snapshots); after a finished or
// recovered fork, none of it may remain.
func leftovers() []string {
	var found []string
	for _, pattern := range []string{
		hostStore.Dir("[^.]*"),
		hostStore.SiblingDir("*"),
		filepath.Join(hostStore.JournalDir(), "*"),
		filepath.Join(hostStore.SnapshotRoot, "*"),
	} {
		matches, _ := filepath.Glob(pattern)
		found = append(found, matches...)
	}
	return found
}

// removePlan removes a plan a test made, with its snapshot.
func removePlan(dir string) { hostStore.Remove(dir) }

// requireNoLeftovers waits briefly for in-flight cleanups, then fails if
// anything of a fork remains.
func requireNoLeftovers(t *testing.T) {
	t.Helper()
	eventually(t, 10*time.Second, "no fork leftovers", func() error {
		if l := leftovers(); len(l) > 0 {
			return fmt.Errorf("left behind: %v", l)
		}
		return nil
	})
}

func freezerState(t *testing.T, b *bundle) string {
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer/tclone-test", b.id, "freezer.state"))
	if err != nil {
		// Pure cgroup v2.
		data, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/tclone-test", b.id, "cgroup.freeze"))
		if err != nil {
			t.Fatalf("reading freezer of %s: %v", b.id, err)
		}
		if strings.TrimSpace(string(data)) == "1" {
			return "FROZEN"
		}
		return "THAWED"
	}
	return strings.TrimSpace(string(data))
}

// requireRunning checks the source is thawed and its counter advances.
func requireRunning(t *testing.T, b *bundle) {
	t.Helper()
	eventually(t, 15*time.Second, b.id+" thawed", func() error {
		if s := freezerState(t, b); s != "THAWED" {
			return fmt.Errorf("freezer %s", s)
		}
		return nil
	})
	a := b.counter(t)
	time.Sleep(400 * time.Millisecond)
	if c := b.counter(t); c <= a {
		t.Fatalf("%s does not run: counter %d then %d", b.id, a, c)
	}
}

// Kill tclone at every phase of a fork: the source never stays frozen, and
// after `tclone gc` nothing is left: no sibling, plan, snapshot, journal
// entry, cgroup or file in the sibling's root.
func TestCrashAtEveryPhase(t *testing.T) {
	requireStack(t)
	requireNoLeftovers(t)
	for _, point := range fork.CrashPoints {
		t.Run(point, func(t *testing.T) {
			src := newBundle(t, "src", true, "sh", "-c", counterScript)
			src.start(t)
			src.counter(t)
			sib := newBundle(t, "sib", false)
			sib.spec.Process.Args = src.spec.Process.Args
			sib.save(t)

			r := forkBundle(t, src, sib, []string{fork.EnvCrashAt + "=" + point})
			if r.code != 128+9 {
				t.Fatalf("tclone was not killed at %s: exit %d, stderr %q", point, r.code, r.stderr)
			}
			// The source runs again without anyone's help (the thaw guard).
			requireRunning(t, src)

			g := run(t, time.Minute, tcloneBin(), "gc")
			if g.code != 0 {
				t.Fatalf("tclone gc: exit %d: %s", g.code, g.stderr)
			}
			requireNoLeftovers(t)
			if st := crunState(t, sib.id); st != "" {
				t.Fatalf("sibling %s still known to crun (%s) after recovery", sib.id, st)
			}
			if entries, _ := os.ReadDir(sib.rootfs()); len(entries) != 0 {
				t.Fatalf("sibling root still holds %d entries", len(entries))
			}
			for _, ctl := range []string{"freezer", "memory", "pids"} {
				if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, "tclone-test", sib.id)); err == nil {
					t.Fatalf("sibling cgroup left in %s", ctl)
				}
			}
			requireRunning(t, src)
			// And the source can still be forked.
			again := newBundle(t, "sib2", false)
			again.spec.Process.Args = src.spec.Process.Args
			again.save(t)
			if r := forkBundle(t, src, again, nil); r.code != 0 {
				t.Fatalf("fork after recovery: exit %d: %s", r.code, r.stderr)
			}
			if again.counter(t) == 0 {
				t.Fatal("sibling made after recovery has no counter")
			}
		})
	}
}
