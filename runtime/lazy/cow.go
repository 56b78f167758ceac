package lazy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/plan"
)

// A copy-on-write plan's memory is its processes' vma_cherrypick snapshots,
// taken by the capture while CRIU held the tree (criuhooks.SnapshotTree).
// The capture hands them to the plan's daemon, started there and then
// (Hold), which keeps them for as long as the plan exists and has not
// expired: its siblings map their pages (Daemon.Share, asked by each
// restore's pre-resume hook, ShareHook) or get copies of them. When the
// plan is gone (its last sibling made, its removal by tclone gc) or
// expired, and nothing is being restored or filled, the daemon exits and
// the snapshots are released. A copy-on-write plan whose daemon died has
// no memory any more: its restores fail (Connect), they never start
// another daemon.

// ShareWait is how long a copy-on-write sibling's tasks wait, after their
// restore finished, for the share their pre-resume hook asks for, before
// they copy their pages instead. (A variable for the tests.)
var ShareWait = 10 * time.Second

// cowConfig is what a copy-on-write plan's daemon holds.
type cowConfig struct {
	// Snapshots are the descriptors, inherited from 3 on, of the
	// processes' snapshots, by image pid.
	Snapshots map[int32]int `json:"snapshots"`
	// PlanDir is the plan's directory: its removal releases the snapshots.
	PlanDir   string    `json:"plan_dir"`
	ExpiresAt time.Time `json:"expires_at"`
	// AnonPages and SwapEntries are what the snapshots held when taken.
	AnonPages   uint64 `json:"anon_pages"`
	SwapEntries uint64 `json:"swap_entries"`
	// ShareWait is ShareWait as the capture saw it.
	ShareWait time.Duration `json:"share_wait"`
	// Twins, for a twin capture, are the processes' twins, by image pid:
	// the daemon holds their pidfds and lifelines (inherited after the
	// snapshots), and ends and reaps them when it exits (releaseTwins).
	Twins map[int32]twinConfig `json:"twins,omitempty"`
}

// twinConfig is one twin the daemon holds.
type twinConfig struct {
	twinRecord
	Pidfd    int `json:"pidfd"`
	Lifeline int `json:"lifeline"`
}

func (c *cowConfig) count() int {
	if c == nil {
		return 0
	}
	return len(c.Snapshots) + 2*len(c.Twins)
}

// files takes the inherited snapshot descriptors, close-on-exec from now
// on: CRIU and the hooks the daemon starts must not hold them.
func (c *cowConfig) files() (map[int32]*os.File, error) {
	out := map[int32]*os.File{}
	for pid, fd := range c.Snapshots {
		f, err := inherited(fd, fmt.Sprintf("snapshot-%d", pid))
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("the snapshot of process %d was not passed: %w", pid, err)
		}
		out[pid] = f
	}
	return out, nil
}

// twins takes the inherited twin descriptors, close-on-exec from now on.
func (c *cowConfig) twins() ([]*heldTwin, error) {
	var out []*heldTwin
	for pid, t := range c.Twins {
		pidfd, err := inherited(t.Pidfd, fmt.Sprintf("pidfd of twin %d", t.Twin))
		if err != nil {
			releaseTwins(out)
			return nil, fmt.Errorf("the twin of process %d was not passed: %w", pid, err)
		}
		lifeline, err := inherited(t.Lifeline, fmt.Sprintf("lifeline of twin %d", t.Twin))
		if err != nil {
			pidfd.Close()
			releaseTwins(out)
			return nil, fmt.Errorf("the twin of process %d was not passed: %w", pid, err)
		}
		out = append(out, &heldTwin{twinRecord: t.twinRecord, imagePid: pid, pidfd: pidfd, lifeline: lifeline})
	}
	return out, nil
}

func inherited(fd int, name string) (*os.File, error) {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, fmt.Errorf("descriptor %d: %w", fd, err)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name), nil
}

// planEnded: the plan was removed, or it expired.
func (c *cowConfig) planEnded() bool {
	if time.Now().After(c.ExpiresAt) {
		return true
	}
	_, err := os.Stat(c.PlanDir)
	return errors.Is(err, os.ErrNotExist)
}

func closeAll(files map[int32]*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// Info is what a plan's daemon holds and serves.
type Info struct {
	Pid int `json:"pid"`
	// Cow: the daemon holds a copy-on-write plan's snapshots (of the
	// module's, or twins: Twins counts these).
	Cow       bool   `json:"cow"`
	Snapshots int    `json:"snapshots,omitempty"`
	Twins     int    `json:"twins,omitempty"`
	AnonPages uint64 `json:"anon_pages,omitempty"`
	// SwapEntries are pages of the snapshots that were swapped out.
	SwapEntries uint64    `json:"swap_entries,omitempty"`
	ExpiresAt   time.Time `json:"expires_at"`
	// Restores are restores connected; Filling, siblings still filling.
	Restores int `json:"restores"`
	Filling  int `json:"filling"`
	// Drain is how far a twin plan's daemon has drained its twins into
	// page images.
	Drain *lazypages.DrainState `json:"drain,omitempty"`
}

func (s *server) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{Pid: os.Getpid(), Restores: s.conns, Filling: s.fills}
	if c := s.cfg.Cow; c != nil {
		in.Cow, in.Snapshots, in.AnonPages, in.SwapEntries, in.ExpiresAt = true, len(c.Snapshots), c.AnonPages, c.SwapEntries, c.ExpiresAt
		in.Twins = len(c.Twins)
		if in.Twins > 0 {
			st := s.d.Drained()
			in.Drain = &st
		}
	}
	return in
}

// Held is a copy-on-write plan's memory, as the capture hands it over.
type Held struct {
	Snapshots *criuhooks.Snapshots
	// Twins, for a twin capture, are the processes' twins, by image pid;
	// Snapshots holds their memory.
	Twins map[int32]*criuhooks.Twin
	// SourceCgroup is the source's cgroup (crun's path): where a twin's
	// zombie is looked for if its daemon died before it reaped it.
	SourceCgroup string
	// Branches is the branch store an incremental drain reads its base
	// from (the plan's images hold lazypages.WritesFile).
	Branches string
}

// Hold starts the daemon of a copy-on-write plan, whose directory is
// planDir, handing it the plan's memory; it returns once the daemon
// answers, with the daemon's pid. The caller's descriptors stay its own to
// close. A daemon already answering for the plan is an error: a plan is
// captured once.
func Hold(ctx context.Context, p Paths, planDir string, expires time.Time, held Held) (int, error) {
	unlock, err := plan.Lock(ctx, p.Lock)
	if err != nil {
		return 0, fmt.Errorf("lazy pages: locking the plan's daemon: %w", err)
	}
	defer unlock()
	if c, err := dial(p.Control); err == nil {
		c.Close()
		return 0, fmt.Errorf("lazy pages: plan %s already has a daemon", planDir)
	}
	os.Remove(p.Control)
	snaps := held.Snapshots
	cow := &cowConfig{Snapshots: map[int32]int{}, PlanDir: planDir, ExpiresAt: expires,
		AnonPages: snaps.AnonPages, SwapEntries: snaps.SwapEntries, ShareWait: ShareWait}
	var extra []*os.File
	for pid, f := range snaps.Files {
		cow.Snapshots[pid] = 3 + len(extra)
		extra = append(extra, f)
	}
	if len(held.Twins) > 0 {
		cow.ShareWait = 0 // twins' pages are copied, never mapped
		cow.Twins = map[int32]twinConfig{}
		rec := twinsRecord{SourceCgroup: held.SourceCgroup}
		for pid, t := range held.Twins {
			r, err := recordTwin(t)
			if err != nil {
				return 0, err
			}
			cow.Twins[pid] = twinConfig{twinRecord: r, Pidfd: 3 + len(extra), Lifeline: 4 + len(extra)}
			extra = append(extra, t.Pidfd, t.Lifeline)
			rec.Twins = append(rec.Twins, r)
		}
		// On record before the daemon holds them: a daemon that dies
		// leaves their zombies to Collect.
		if err := writeTwinsRecord(p, rec); err != nil {
			return 0, err
		}
	}
	cmd, err := spawn(p, daemonConfig{PlanImages: plan.ImagesDir(planDir), Cow: cow, Branches: held.Branches}, extra)
	if err != nil {
		removeTwinsRecord(p)
		return 0, err
	}
	c, err := waitAnswer(ctx, p, cmd)
	if err != nil {
		return 0, err
	}
	c.Close()
	return cmd.Process.Pid, nil
}

// Connect connects to a copy-on-write plan's daemon, which holds the
// plan's memory: none answering means the memory is gone.
func Connect(p Paths) (*Client, error) {
	c, err := dial(p.Control)
	if err != nil {
		return nil, fmt.Errorf("the plan's memory is gone: the lazy-pages daemon that held its copy-on-write snapshots does not answer (%v; its log: %s)", err, p.Log)
	}
	return c, nil
}

// Ask sends one request to a plan's daemon and returns its answer.
func Ask(p Paths, request string) (string, error) {
	c, err := dial(p.Control)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.request(request)
}

// Holders lists the daemons of layout l that hold copy-on-write snapshots,
// by plan ID.
func Holders(l plan.Layout) (map[string]Info, error) {
	entries, err := os.ReadDir(l.LazyDir())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]Info{}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".sock")
		if !ok {
			continue
		}
		answer, err := Ask(PathsFor(l, id), "info")
		if err != nil {
			continue // a dead daemon's socket: Collect's
		}
		var in Info
		if json.Unmarshal([]byte(answer), &in) == nil && in.Cow {
			out[id] = in
		}
	}
	return out, nil
}
