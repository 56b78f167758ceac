package plan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/test/testenv"
)

// testStore is a store whose plan directory is an ordinary directory: the
// tmpfs mount is exercised by the integration tests.
func testStore(t *testing.T) Store {
	t.Helper()
	s := Store{Layout: LayoutUnder(t.TempDir())}
	if err := os.MkdirAll(s.PlansDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	return s
}

func newPlan(t *testing.T, s Store, uses int) string {
	t.Helper()
	return newPlanFor(t, s, uses, nil)
}

// newPlanFor is newPlan with its uses held for client.
func newPlanFor(t *testing.T, s Store, uses int, client *journal.Owner) string {
	t.Helper()
	id := NewID()
	dir := s.Dir(id)
	if err := os.MkdirAll(ImagesDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	p := &Plan{Version: FormatVersion, ID: id, ExpiresAt: time.Now().Add(time.Hour)}
	if err := p.Write(dir); err != nil {
		t.Fatal(err)
	}
	if err := SetUses(dir, uses, client); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPlanRemovedWithLastUse(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 2)
	a, err := s.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(dir); !errors.Is(err, ErrUsedUp) {
		t.Fatalf("third use of a two-use plan: %v", err)
	}
	if err := a.Release(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal("plan removed while a use is still in flight")
	}
	if err := b.Release(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("plan kept after its last use")
	}
}

func TestFailedUseIsGivenBack(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 1)
	l, err := s.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	l.Release(false)
	if u, _ := ReadUses(dir); u.Remaining != 1 || len(u.InFlight) != 0 {
		t.Fatalf("uses after a failed use: %+v", u)
	}
	if _, err := s.Acquire(dir); err != nil {
		t.Fatalf("plan not usable again after a failed use: %v", err)
	}
}

func TestUnlimitedPlanExpires(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, Unlimited)
	for i := 0; i < 5; i++ {
		l, err := s.Acquire(dir)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(true)
	}
	if removed, err := s.Sweep(dir, time.Now()); removed != "" || err != nil {
		t.Fatalf("swept early: %v %v", removed, err)
	}
	l, _ := s.Acquire(dir)
	if removed, _ := s.Sweep(dir, time.Now().Add(2*time.Hour)); removed != "" {
		t.Fatal("a plan with a use in flight was swept")
	}
	l.Release(true)
	if removed, _ := s.Sweep(dir, time.Now().Add(2*time.Hour)); removed != SweptExpired {
		t.Fatal("an expired plan was kept")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("swept plan still on disk")
	}
}

// A use held by a process that died is given back, once.
func TestDeadHoldersUseIsGivenBack(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 1)
	if _, err := s.Acquire(dir); err != nil {
		t.Fatal(err)
	}
	u, _ := ReadUses(dir)
	u.InFlight[0].StartTime++ // the holder is now a process that no longer runs
	atomicfile.WriteJSON(usesPath(dir), u, 0o600)
	for i := 0; i < 2; i++ {
		if _, err := s.Sweep(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := ReadUses(dir); u.Remaining != 1 || len(u.InFlight) != 0 {
		t.Fatalf("uses after reaping: %+v", u)
	}
}

func TestAcquireRefusesExpiredPlan(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 1)
	p, _ := Read(dir)
	p.ExpiresAt = time.Now().Add(-time.Minute)
	p.Write(dir)
	if _, err := s.Acquire(dir); !errors.Is(err, ErrExpired) {
		t.Fatalf("acquire of an expired plan: %v", err)
	}
}

func TestReadRejectsOtherVersions(t *testing.T) {
	s := testStore(t)
	dir := newPlan(t, s, 1)
	os.WriteFile(filepath.Join(dir, "plan.json"), []byte(`{"version": 99}`), 0o600)
	if _, err := Read(dir); err == nil {
		t.Fatal("read a plan of an unknown format version")
	}
	if _, err := Read(filepath.Join(s.PlansDir(), "missing")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing plan: %v", err)
	}
}

func TestIntentTakenOnce(t *testing.T) {
	s := testStore(t)
	if err := s.WriteIntent(Intent{ContainerID: "c1", Fork: forkopts.Fork{Uses: 3, Identity: forkopts.IdentityUnique}}); err != nil {
		t.Fatal(err)
	}
	in, err := s.TakeIntent("c1")
	if err != nil || in == nil || in.Fork.Uses != 3 {
		t.Fatalf("take: %+v %v", in, err)
	}
	if again, _ := s.TakeIntent("c1"); again != nil {
		t.Fatal("an intent was taken twice")
	}
	s.WriteIntent(Intent{ContainerID: "c2", ExpiresAt: time.Now().Add(-time.Second)})
	if in, _ := s.TakeIntent("c2"); in != nil {
		t.Fatal("an expired intent was taken")
	}
}

func TestReferenceRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if ref, err := ReadReference(dir); ref != nil || err != nil {
		t.Fatalf("an ordinary checkpoint directory read as a reference: %v %v", ref, err)
	}
	if err := WriteReference(dir, Reference{PlanID: "p", PlanDir: "/run/tclone/plans/p"}); err != nil {
		t.Fatal(err)
	}
	ref, err := ReadReference(dir)
	if err != nil || ref.PlanDir != "/run/tclone/plans/p" {
		t.Fatalf("%+v %v", ref, err)
	}
	// Removed, twice: the directory is an ordinary checkpoint's again.
	for i := 0; i < 2; i++ {
		if err := RemoveReference(dir); err != nil {
			t.Fatal(err)
		}
	}
	if ref, err := ReadReference(dir); ref != nil || err != nil {
		t.Fatalf("a removed reference read back: %v %v", ref, err)
	}
}

func TestEnsureTmpfsMountsWhereNeeded(t *testing.T) {
	testenv.NeedRoot(t, "mounting a tmpfs")
	s := testStore(t)
	if err := s.EnsureTmpfs(); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(s.PlansDir(), unix.MNT_DETACH)
	var fs unix.Statfs_t
	unix.Statfs(s.PlansDir(), &fs)
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatal("plan store is not tmpfs")
	}
	// Idempotent: no second mount on top.
	if err := s.EnsureTmpfs(); err != nil {
		t.Fatal(err)
	}
}

// Only plans inside the store are plans: a directory elsewhere, however it
// looks, is not, because a plan names host paths tclone copies and removes.
func TestResolveOnlyInsideTheStore(t *testing.T) {
	s := testStore(t)
	id := NewID()
	good := map[string]string{
		id:                                       s.Dir(id),
		s.Dir(id):                                s.Dir(id),
		filepath.Join(s.Dir(id), "images"):       s.Dir(id),
		filepath.Join(s.Dir(id), "images") + "/": s.Dir(id),
	}
	for ref, want := range good {
		if got, err := s.Resolve(ref); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "relative/path", "/var/lib/containers/x/userdata/checkpoint", s.PlansDir(),
		filepath.Join(s.PlansDir(), "..", "..", "etc"), filepath.Join(s.PlansDir(), ".siblings", "x"),
		filepath.Join(s.PlansDir(), "not-an-id"), "../../etc",
	} {
		if got, err := s.Resolve(bad); !errors.Is(err, ErrNotInStore) {
			t.Errorf("Resolve(%q) = %q, %v; want ErrNotInStore", bad, got, err)
		}
	}
}

// A fork client withdraws only its own intent, never a later one.
func TestRemoveIntentOnlyOwn(t *testing.T) {
	s := testStore(t)
	s.WriteIntent(Intent{ContainerID: "c", Nonce: "second"})
	if err := s.RemoveIntent("c", "first"); err != nil {
		t.Fatal(err)
	}
	if in, _ := s.TakeIntent("c"); in == nil || in.Nonce != "second" {
		t.Fatalf("another request's intent was removed: %+v", in)
	}
}

// A snapshot kept outside the snapshot store is found through its marker.
func TestExternalSnapshotMarker(t *testing.T) {
	s := testStore(t)
	id := NewID()
	if err := s.RecordExternalSnapshot(id, filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Fatal(err)
	}
	// The snapshot itself was never taken: removing is a no-op that drops
	// the marker.
	if err := s.RemoveSnapshots(id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.SnapshotRoot, id+ExternalSnapshotSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("marker kept")
	}
}

// Plans of the source captured since the request are removed; older plans
// and other sources' plans are not.
func TestRemoveCapturedSince(t *testing.T) {
	s := testStore(t)
	mk := func(source string, created time.Time) string {
		dir := newPlan(t, s, 1)
		p, _ := Read(dir)
		p.Source.ID, p.CreatedAt = source, created
		p.Write(dir)
		return dir
	}
	since := time.Now()
	older := mk("src", since.Add(-time.Minute))
	other := mk("other", since.Add(time.Second))
	mine := mk("src", since.Add(time.Second))
	if err := s.RemoveCapturedSince("src", since); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]bool{older: true, other: true, mine: false} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", dir, err == nil, want)
		}
	}
}

// Fork requests for one container wait for each other.
func TestLockIntentsIsExclusive(t *testing.T) {
	s := testStore(t)
	unlock, err := s.LockIntents("c")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		u, err := s.LockIntents("c")
		if err == nil {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second request got the lock while the first held it")
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the second request never got the lock")
	}
}

// A plan's volume copies go with its snapshots.
func TestRemoveSnapshotsRemovesVolumeCopies(t *testing.T) {
	s := testStore(t)
	id := NewID()
	copyDir := filepath.Join(s.VolumesDir(id), "0")
	if err := os.MkdirAll(copyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(copyDir, "f"), []byte("x"), 0o600)
	if err := s.RemoveSnapshots(id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.VolumesDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("volume copies kept")
	}
}

func TestCheckMemoryRefusesContradictions(t *testing.T) {
	held := &Snapshots{Processes: 2, HolderPid: 42}
	for _, c := range []struct {
		memory    forkopts.Memory
		snapshots *Snapshots
		want      string
	}{
		{forkopts.MemoryCow, held, ""},
		{forkopts.MemoryLazy, nil, ""},
		{"", nil, ""},
		{forkopts.MemoryCow, nil, "records no snapshots"},
		{forkopts.MemoryCopy, held, `"copy", not cow`},
	} {
		p := &Plan{ID: "p1", Memory: c.memory, Snapshots: c.snapshots}
		err := p.CheckMemory()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("memory %q, snapshots %v: %v", c.memory, c.snapshots != nil, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "fork the source again")):
			t.Errorf("memory %q, snapshots %v: got %v, want an error naming %q and what to do", c.memory, c.snapshots != nil, err, c.want)
		}
	}
}

// A writer still publishing into a plan by its path (a lazy-pages daemon
// draining twins) while the plan is removed puts nothing back: no plan
// directory, and no half-removed one, is left.
func TestRemoveWhileAWriterPublishes(t *testing.T) {
	s := Store{Layout: LayoutUnder(t.TempDir())}
	for round := range 20 {
		dir := s.Dir(NewID())
		images := filepath.Join(dir, "images")
		if err := os.MkdirAll(images, 0o700); err != nil {
			t.Fatal(err)
		}
		stop, stopped := make(chan struct{}), make(chan struct{})
		wrote := make(chan struct{})
		go func() {
			defer close(stopped)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// As publish does: a file into the plan's images, by path,
				// once the directory is seen to be there.
				if _, err := os.Stat(images); err == nil {
					os.WriteFile(filepath.Join(images, fmt.Sprintf("pages-%d.img", i)), nil, 0o600)
				}
				if i == 10 {
					close(wrote)
				}
			}
		}()
		<-wrote
		err := s.Remove(dir)
		close(stop)
		<-stopped
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: the plan directory is back: %v", round, err)
		}
		if left, _ := filepath.Glob(filepath.Join(s.PlansDir(), removingPrefix+"*")); len(left) > 0 {
			t.Fatalf("round %d: left %v", round, left)
		}
	}
}

// InGonePlan reads paths as /proc/PID/cwd shows them: a plan removed, or
// renamed by Remove, is gone; a live plan, a name that is no plan's, and a
// path outside the store are not.
func TestInGonePlan(t *testing.T) {
	s := testStore(t)
	live, gone := NewID(), NewID()
	if err := os.MkdirAll(filepath.Join(s.Dir(live), "work"), 0o700); err != nil {
		t.Fatal(err)
	}
	plans := s.PlansDir()
	for _, c := range []struct {
		path string
		want bool
	}{
		{filepath.Join(s.Dir(live), "work"), false},
		{filepath.Join(s.Dir(gone), "work"), true},
		{filepath.Join(s.Dir(gone), "work") + " (deleted)", true},
		{filepath.Join(plans, removingPrefix+live+"-"+NewID(), "work") + " (deleted)", true},
		{filepath.Join(plans, removingPrefix+live+"-"+NewID()), true},
		{s.Dir(gone), true},
		{filepath.Join(plans, "not-a-plan", "work"), false},
		{plans, false},
		{plans + "-elsewhere/" + gone, false},
		{"/tmp/" + gone, false},
	} {
		if got := s.InGonePlan(c.path); got != c.want {
			t.Errorf("InGonePlan(%q) = %v, want %v", c.path, got, c.want)
		}
	}
}
