package lazy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/test/testenv"
)

// The test binary is the daemon too, as tclone is.
func TestMain(m *testing.M) {
	RunDaemonIfAsked()
	RunShareHookIfAsked()
	os.Exit(m.Run())
}

// fakePlan is a plan images directory with what the daemon opens at start.
func fakePlan(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"pstree.img", "pages-1.img"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "the lazy-pages daemon's guard")
}

func waitGone(t *testing.T, path string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there after %s", path, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One daemon per plan: a second restore reaches the daemon the first one
// started; the daemon serves from links of its own, which outlive the
// plan's directory; once no restore is connected it exits and removes
// them.
func TestOneDaemonPerPlanExitsWhenIdle(t *testing.T) {
	requireRoot(t)
	defer func(old time.Duration) { IdleExit = old }(IdleExit)
	IdleExit = 300 * time.Millisecond
	p := PathsFor(plan.LayoutUnder(t.TempDir()), "plan1")
	planImages := fakePlan(t)

	a, err := Ensure(context.Background(), p, planImages)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "lazy-pages.socket")
	if err := a.Listen(sock); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the daemon does not listen where asked: %v", err)
	}
	if _, err := os.Stat(filepath.Join(p.Images, "pages-1.img")); err != nil {
		t.Fatalf("the daemon's images: %v", err)
	}
	os.RemoveAll(planImages) // the plan's last use removed it
	b, err := Ensure(context.Background(), p, planImages)
	if err != nil {
		t.Fatalf("a second restore did not reach the running daemon: %v", err)
	}
	if err := b.Listen(filepath.Join(t.TempDir(), "lazy-pages.socket")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	time.Sleep(2 * IdleExit)
	if _, err := os.Stat(p.Control); err != nil {
		t.Fatal("the daemon left while a restore was still connected")
	}
	b.Close()
	waitGone(t, p.Control, 5*time.Second)
	waitGone(t, p.Images, 5*time.Second)
	waitGone(t, p.Lock, 5*time.Second)
	if err := b.Listen("/x"); err == nil {
		t.Fatal("a closed client still talks")
	}
}

func TestListenRefusal(t *testing.T) {
	requireRoot(t)
	defer func(old time.Duration) { IdleExit = old }(IdleExit)
	IdleExit = 200 * time.Millisecond
	p := PathsFor(plan.LayoutUnder(t.TempDir()), "plan2")
	c, err := Ensure(context.Background(), p, fakePlan(t))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Listen(filepath.Join(t.TempDir(), "missing-dir", "lazy-pages.socket"))
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("listening in a missing directory: %v", err)
	}
	// The daemon is gone before the test's directories are removed.
	c.Close()
	waitGone(t, p.Lock, 5*time.Second)
	waitGone(t, p.Images, 5*time.Second)
}

// A daemon that was killed leaves files; Collect removes them, and leaves
// a live daemon's alone.
func TestCollectAfterKilledDaemon(t *testing.T) {
	requireRoot(t)
	defer func(old time.Duration) { IdleExit = old }(IdleExit)
	IdleExit = 200 * time.Millisecond
	l := plan.LayoutUnder(t.TempDir())
	live := PathsFor(l, "live")
	c, err := Ensure(context.Background(), live, fakePlan(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead := PathsFor(l, "dead")
	d, err := Ensure(context.Background(), dead, fakePlan(t))
	if err != nil {
		t.Fatal(err)
	}
	pid := daemonPid(t, d)
	syscall.Kill(pid, syscall.SIGKILL)
	d.Close()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Its guard shares its descriptors (the lock, the control socket) and
	// exits right after it: until then the control socket still takes
	// connections, and a collection leaves the daemon as live (on a busy
	// host that is some milliseconds). A later collection removes it.
	var removed []string
	for deadline := time.Now().Add(10 * time.Second); len(removed) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if removed, err = Collect(l); err != nil {
			t.Fatal(err)
		}
	}
	if len(removed) != 1 || removed[0] != "dead" {
		t.Fatalf("collected %v", removed)
	}
	for _, path := range []string{dead.Images, dead.Control, dead.Lock} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s left", path)
		}
	}
	if _, err := os.Stat(live.Images); err != nil {
		t.Errorf("a live daemon's images were removed: %v", err)
	}
	c.Close()
	waitGone(t, live.Control, 5*time.Second)
}

// daemonPid finds the daemon serving c from its peer credentials.
func daemonPid(t *testing.T, c *Client) int {
	t.Helper()
	raw, err := c.conn.(interface {
		SyscallConn() (syscall.RawConn, error)
	}).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	raw.Control(func(fd uintptr) {
		cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err == nil {
			pid = int(cred.Pid)
		}
	})
	if pid == 0 {
		t.Fatal("no peer pid")
	}
	t.Logf("daemon pid %s", strconv.Itoa(pid))
	return pid
}

// A silent daemon's lock held for a moment (its guard still exiting) is
// waited for, and what it left is removed; one held past the wait (a daemon
// starting) is left alone.
func TestCollectWaitsForADyingDaemonsLock(t *testing.T) {
	defer func(old time.Duration) { collectLockWait = old }(collectLockWait)
	collectLockWait = time.Second
	l := plan.LayoutUnder(t.TempDir())
	for _, c := range []struct {
		id      string
		hold    time.Duration
		removed bool
	}{{"dying", 200 * time.Millisecond, true}, {"starting", 3 * time.Second, false}} {
		p := PathsFor(l, c.id)
		if err := os.MkdirAll(p.Images, 0o700); err != nil {
			t.Fatal(err)
		}
		unlock, err := plan.Lock(context.Background(), p.Lock)
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan struct{})
		go func() {
			time.Sleep(c.hold)
			unlock()
			close(released)
		}()
		removed, err := Collect(l)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(removed, c.id); got != c.removed {
			t.Errorf("%s (lock held %s): removed %v, want %v", c.id, c.hold, got, c.removed)
		}
		if _, err := os.Stat(p.Images); os.IsNotExist(err) == !c.removed {
			t.Errorf("%s: images left = %v", c.id, err == nil)
		}
		<-released
	}
}
