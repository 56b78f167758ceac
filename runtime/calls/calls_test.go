package calls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/runtime/procfs"
)

// fakePodman holds containers as ID -> labels.
type fakePodman struct {
	ctrs    map[string]map[string]string
	removed []string
	failRm  bool
}

func (f *fakePodman) Labelled(_ context.Context, key string) (map[string]string, error) {
	m := map[string]string{}
	for id, labels := range f.ctrs {
		if v, ok := labels[key]; ok {
			m[id] = v
		}
	}
	return m, nil
}

func (f *fakePodman) Remove(_ context.Context, id string) error {
	if f.failRm {
		return errors.New("podman is down")
	}
	delete(f.ctrs, id)
	f.removed = append(f.removed, id)
	return nil
}

// deadOwner is the identity of a process that has exited.
func deadOwner(t *testing.T) journal.Owner {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return journal.Owner{Pid: cmd.Process.Pid, StartTime: 1}
}

func kill(t *testing.T, c *Call) {
	t.Helper()
	if err := c.Update(func(r *Record) { r.Owner = deadOwner(t) }); err != nil {
		t.Fatal(err)
	}
}

type fixture struct {
	store plan.Store
	dir   Dir
	pm    *fakePodman
	tmp   string
}

func newFixture(t *testing.T) *fixture {
	root := t.TempDir()
	store := plan.Store{Layout: plan.LayoutUnder(root)}
	return &fixture{
		store: store, dir: DirOf(store), tmp: store.TempDir(),
		pm: &fakePodman{ctrs: map[string]map[string]string{}},
	}
}

func (f *fixture) collector() Collector {
	ensureTempDir(f.tmp)
	return Collector{Dir: f.dir, Store: f.store, Podman: f.pm}
}

func (f *fixture) records(t *testing.T) []string {
	t.Helper()
	entries, _ := os.ReadDir(f.dir.Path)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestBeginUpdateEnd(t *testing.T) {
	f := newFixture(t)
	c, err := f.dir.Begin(Record{SourceID: "src"})
	if err != nil {
		t.Fatal(err)
	}
	rec := c.Record()
	if rec.Nonce == "" || rec.Owner != journal.Self() || rec.Version != FormatVersion {
		t.Fatalf("record %+v", rec)
	}
	if err := c.Update(func(r *Record) { r.Siblings = append(r.Siblings, "a") }); err != nil {
		t.Fatal(err)
	}
	onDisk, err := readRecord(c.path)
	if err != nil || len(onDisk.Siblings) != 1 || onDisk.Nonce != rec.Nonce {
		t.Fatalf("on disk %+v %v", onDisk, err)
	}
	if !strings.Contains(filepath.Base(c.path), rec.Nonce) {
		t.Errorf("record name %s does not hold the nonce", c.path)
	}
	if err := c.End(); err != nil {
		t.Fatal(err)
	}
	if n := f.records(t); len(n) != 0 {
		t.Fatalf("left %v", n)
	}
}

// A dead call's rollback removes its recorded siblings and the container
// labelled with its nonce, never a live call's or anybody else's, even with
// the same source and the same names.
func TestCollectRemovesOnlyWhatTheDeadCallMade(t *testing.T) {
	f := newFixture(t)
	dead, _ := f.dir.Begin(Record{SourceID: "src"})
	live, _ := f.dir.Begin(Record{SourceID: "src"})
	dn, ln := dead.Record().Nonce, live.Record().Nonce
	f.pm.ctrs["made"] = map[string]string{LabelCall: dn}
	f.pm.ctrs["half"] = map[string]string{LabelCall: dn} // a restore cut short
	f.pm.ctrs["livesib"] = map[string]string{LabelCall: ln}
	f.pm.ctrs["user"] = map[string]string{"io.tclone.forked-from": "src"}
	f.pm.ctrs["old"] = map[string]string{LabelCall: "someone-else"}
	// A plan directory made by hand: Store.Create would mount a tmpfs.
	planDir := f.store.Dir(plan.NewID())
	if err := os.MkdirAll(planDir, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(f.tmp, "tclone-fork-123")
	os.MkdirAll(tmp, 0o700)
	notOurs := filepath.Join(f.tmp, "precious")
	os.MkdirAll(notOurs, 0o700)
	dead.Update(func(r *Record) {
		r.Siblings = []string{"made"}
		r.PlanDir = planDir
		r.TempDirs = []string{tmp, notOurs}
	})
	kill(t, dead)

	rep, err := f.collector().Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(f.pm.removed)
	if strings.Join(f.pm.removed, ",") != "half,made" {
		t.Fatalf("removed %v", f.pm.removed)
	}
	if len(rep.Calls) != 1 || rep.Calls[0].PlanDir != planDir || len(rep.Calls[0].Siblings) != 2 {
		t.Fatalf("report %+v", rep)
	}
	for path, want := range map[string]bool{planDir: false, tmp: false, notOurs: true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", path, err == nil, want)
		}
	}
	live.End()
}

// A container a dead client's request creates after the rollback is still
// swept while the call lingers as a tombstone; after Linger the tombstone
// goes.
func TestTombstoneSweepsLateContainers(t *testing.T) {
	f := newFixture(t)
	c, _ := f.dir.Begin(Record{})
	nonce := c.Record().Nonce
	kill(t, c)
	col := f.collector()
	if _, err := col.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := f.records(t); len(n) != 1 || strings.Contains(n[0], journal.ClaimSep) {
		t.Fatalf("tombstone %v", n)
	}
	f.pm.ctrs["late"] = map[string]string{LabelCall: nonce}
	rep, err := col.Collect(context.Background())
	if err != nil || len(rep.Calls) != 1 || rep.Calls[0].Siblings[0] != "late" {
		t.Fatalf("second collect %+v %v", rep, err)
	}
	if _, err := col.Collect(context.Background()); err != nil || len(f.pm.removed) != 1 {
		t.Fatalf("a tombstone removed %v", f.pm.removed)
	}
	// Age the tombstone past Linger.
	path := filepath.Join(f.dir.Path, f.records(t)[0])
	rec, _ := readRecord(path)
	old := &Call{path: path, rec: *rec}
	old.Update(func(r *Record) { r.RolledBack = time.Now().Add(-Linger - time.Minute) })
	if _, err := col.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := f.records(t); len(n) != 0 {
		t.Fatalf("tombstone kept past Linger: %v", n)
	}
}

// A rollback that fails is handed back, and the next collection retries it.
func TestFailedRollbackIsRetried(t *testing.T) {
	f := newFixture(t)
	c, _ := f.dir.Begin(Record{Siblings: []string{"s1"}})
	f.pm.ctrs["s1"] = map[string]string{}
	kill(t, c)
	f.pm.failRm = true
	if _, err := f.collector().Collect(context.Background()); err == nil {
		t.Fatal("a failed removal was not reported")
	}
	if n := f.records(t); len(n) != 1 || strings.Contains(n[0], journal.ClaimSep) {
		t.Fatalf("record not handed back: %v", n)
	}
	f.pm.failRm = false
	if _, err := f.collector().Collect(context.Background()); err != nil || len(f.pm.removed) != 1 {
		t.Fatalf("retry: removed %v, %v", f.pm.removed, err)
	}
}

// Two collectors never take the same call; a claim whose collector died is
// claimed again.
func TestClaims(t *testing.T) {
	f := newFixture(t)
	c, _ := f.dir.Begin(Record{})
	kill(t, c)
	first, err := f.dir.claimDead()
	if err != nil || len(first) != 1 {
		t.Fatalf("%v %v", first, err)
	}
	if again, _ := f.dir.claimDead(); len(again) != 0 {
		t.Fatal("a call claimed by a live collector was claimed twice")
	}
	// The claimer dies.
	dead := deadOwner(t)
	os.Rename(first[0].path, journal.ClaimedBy(journal.Unclaimed(first[0].path), dead))
	if again, _ := f.dir.claimDead(); len(again) != 1 {
		t.Fatal("the claim of a dead collector was not taken over")
	}
}

func TestTempDirs(t *testing.T) {
	f := newFixture(t)
	col := f.collector()
	mine, err := MkdirTemp(f.store, "tclone-fork-")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := MkdirTemp(f.store, "podman-fork-")
	writeDirOwner(dead, DirOwner{Owner: deadOwner(t)})
	// A dead client's service, still running in a process group of its own.
	svc := exec.Command("sleep", "60")
	svc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { svc.Wait(); close(exited) }()
	withSvc, _ := MkdirTemp(f.store, "podman-fork-")
	svcOwner, _ := journal.OwnerOf(svc.Process.Pid)
	if err := RecordService(withSvc, svcOwner); err != nil {
		t.Fatal(err)
	}
	o, _ := readDirOwner(withSvc)
	o.Owner = deadOwner(t)
	writeDirOwner(withSvc, *o)
	unownedOld := filepath.Join(f.tmp, "tclone-fork-old")
	unownedNew := filepath.Join(f.tmp, "tclone-fork-new")
	// Its maker was killed before writing the owner file: its name says who.
	unownedDeadMaker := filepath.Join(f.tmp, fmt.Sprintf("podman-fork-%d-1234", deadOwner(t).Pid))
	unownedLiveMaker := filepath.Join(f.tmp, fmt.Sprintf("tclone-fork-%d-1234", os.Getpid()))
	other := filepath.Join(f.tmp, "something-else")
	for _, d := range []string{unownedOld, unownedNew, unownedDeadMaker, unownedLiveMaker, other} {
		os.MkdirAll(d, 0o700)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(unownedOld, past, past)
	os.Chtimes(other, past, past)

	rep, err := col.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		svc.Process.Kill()
		t.Fatal("the dead client's service was not stopped")
	}
	if len(rep.Services) != 1 || rep.Services[0] != svc.Process.Pid {
		t.Errorf("services stopped %v", rep.Services)
	}
	for path, want := range map[string]bool{mine: true, dead: false, withSvc: false, unownedOld: false, unownedNew: true, unownedDeadMaker: false, unownedLiveMaker: true, other: true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", path, err == nil, want)
		}
	}
}

// A killed client its parent has not reaped yet is dead all the same.
func TestZombieIsDead(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	var o journal.Owner
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procfs.ReadStat(pid)
		if err == nil && st.State == 'Z' {
			o = journal.Owner{Pid: pid, StartTime: st.StartTime}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no zombie: %c %v", st.State, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer cmd.Wait()
	if o.Running() {
		t.Fatal("a zombie counts as alive")
	}
	if !journal.Self().Running() {
		t.Fatal("this process counts as dead")
	}
}

func TestIsTempDir(t *testing.T) {
	root := "/run/tclone/tmp"
	for path, want := range map[string]bool{
		root + "/tclone-fork-1": true, root + "/podman-fork-x": true, root + "/x/../tclone-fork-1": false,
		"tclone-fork-1": false, root + "/other": false, "/": false,
		// Named as a client's, but not in the clients' directory.
		"/tmp/tclone-fork-1": false, root + "/sub/tclone-fork-1": false,
	} {
		if got := isTempDir(root, path); got != want {
			t.Errorf("isTempDir(%q) = %v", path, got)
		}
	}
}

func readRecord(path string) (*Record, error) {
	var rec Record
	err := atomicfile.ReadJSON(path, &rec)
	return &rec, err
}

// A record update's temporary file, left by an owner killed between writing
// and renaming it, is collected; a live owner's is not.
func TestCollectRemovesDeadOwnersUpdateTemps(t *testing.T) {
	f := newFixture(t)
	os.MkdirAll(f.dir.Path, 0o700)
	self := journal.Self()
	live := filepath.Join(f.dir.Path, fmt.Sprintf("%d-%d-n1.json.tmp1", self.Pid, self.StartTime))
	dead := filepath.Join(f.dir.Path, fmt.Sprintf("%d-%d-n2.json.tmp2", self.Pid, self.StartTime+1))
	// A claimed record is written by its claimer, named after the claim.
	liveClaim := filepath.Join(f.dir.Path, fmt.Sprintf("1-2-n3.json%s%d-%d.tmp3", journal.ClaimSep, self.Pid, self.StartTime))
	deadClaim := filepath.Join(f.dir.Path, fmt.Sprintf("%d-%d-n4.json%s%d-%d.tmp4", self.Pid, self.StartTime, journal.ClaimSep, self.Pid, self.StartTime+1))
	for _, p := range []string{live, dead, liveClaim, deadClaim} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.collector().Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dead, deadClaim} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("a dead writer's update temp was kept: %s", filepath.Base(p))
		}
	}
	for _, p := range []string{live, liveClaim} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a live writer's update temp was removed: %v", err)
		}
	}
}

// A dead Kubernetes fork's pods are removed through the CRI endpoint it
// recorded, never through Podman; a Podman call's through Podman; and with
// no CRI client the Kubernetes call is kept for a collector that has one.
func TestCollectRollsBackKubernetesForksThroughTheirCRI(t *testing.T) {
	f := newFixture(t)
	cri := &fakePodman{ctrs: map[string]map[string]string{}}
	var endpoints []string
	kube, _ := f.dir.Begin(Record{SourceID: "ctr", CRI: "unix:///run/c.sock"})
	pod, _ := f.dir.Begin(Record{SourceID: "src"})
	kn, pn := kube.Record().Nonce, pod.Record().Nonce
	cri.ctrs["pod-made"] = map[string]string{LabelCall: kn}
	cri.ctrs["pod-other"] = map[string]string{LabelCall: "someone-else"}
	f.pm.ctrs["ctr-made"] = map[string]string{LabelCall: pn}
	// A Podman container that happens to carry the Kubernetes call's nonce
	// is not the Kubernetes call's to remove.
	f.pm.ctrs["ctr-same-nonce"] = map[string]string{LabelCall: kn}
	kube.Update(func(r *Record) { r.Siblings = []string{"pod-recorded"} })
	cri.ctrs["pod-recorded"] = map[string]string{}
	kill(t, kube)
	kill(t, pod)

	c := f.collector()
	without := c
	// Podman's (the shim's, at every fork) undoes the Podman call, and
	// leaves the Kubernetes one without a word: it is not an error there.
	if rep, err := without.Collect(context.Background()); err != nil || len(rep.Calls) != 1 || rep.Calls[0].Nonce != pn || len(rep.Kept) != 0 {
		t.Fatalf("a collector without a CRI client: %+v, %v", rep, err)
	}
	if len(cri.removed) != 0 || len(f.records(t)) != 2 {
		t.Fatalf("a collector without a CRI client undid the Kubernetes call (records %d)", len(f.records(t)))
	}
	c.CRI = func(endpoint string) Podman { endpoints = append(endpoints, endpoint); return cri }
	if _, err := c.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	sort.Strings(cri.removed)
	if strings.Join(cri.removed, ",") != "pod-made,pod-recorded" {
		t.Errorf("pods removed %v", cri.removed)
	}
	if strings.Join(f.pm.removed, ",") != "ctr-made" {
		t.Errorf("Podman containers removed %v", f.pm.removed)
	}
	if strings.Join(endpoints, ",") != "unix:///run/c.sock" {
		t.Errorf("CRI clients made for %v, want the recorded endpoint once", endpoints)
	}
}
