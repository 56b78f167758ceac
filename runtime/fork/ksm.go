package fork

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/runtime/cgroups"
	"github.com/tclone/tclone/runtime/crun"
	"github.com/tclone/tclone/runtime/internal/fds"
	"github.com/tclone/tclone/runtime/internal/flock"
	"github.com/tclone/tclone/runtime/ksm"
	"github.com/tclone/tclone/runtime/plan"
)

// KSMSettleCommand is the hidden argv[1] under which the tclone binary waits
// for merging forks to age and then puts ksmd's settings back.
const KSMSettleCommand = "__tclone-ksm-settle"

// ksmTuner keeps its state with the host's live state (<Root>/ksm): a
// sibling counts as young while crun knows it and for the window after its
// fork.
func (e *Engine) ksmTuner(window time.Duration) ksm.Tuner {
	return ksm.Tuner{Dir: ksmDir(e.Store.Layout), Window: window, Alive: func(id string) bool {
		_, err := e.Crun.State(context.Background(), id)
		return err == nil
	}}
}

// mergingSibling records a merging sibling, turns ksmd up, and makes sure a
// settle process will turn it back down. A failure leaves the sibling as it
// is: its memory merges at the host's own pace.
func (e *Engine) mergingSibling(id string) {
	window := ksm.DefaultWindow
	if err := e.ksmTuner(window).Young(id); err != nil {
		logrus.Warnf("sibling %s is mergeable, but ksmd could not be turned up: %v", id, err)
		return
	}
	if err := e.spawnKSMSettle(window); err != nil {
		logrus.Warnf("ksmd stays turned up until the next fork or tclone gc: %v", err)
	}
}

// settleKSM puts ksmd's settings back if no merging fork is young, as
// recovery does after a settle process died.
func (e *Engine) settleKSM() error {
	next, err := e.ksmTuner(ksm.DefaultWindow).Settle(time.Now())
	if err == nil && next > 0 {
		err = e.spawnKSMSettle(ksm.DefaultWindow)
	}
	return err
}

// settleLook is how often the settle process looks for siblings gone.
const settleLook = 5 * time.Second

type ksmSettleConfig struct {
	Layout   plan.Layout   `json:"layout"`
	CrunRoot string        `json:"crun_root"`
	Window   time.Duration `json:"window"`
}

// ksmDir holds the settle process's lock and the young merging forks.
func ksmDir(l plan.Layout) string { return filepath.Join(l.Root, "ksm") }

// spawnKSMSettle starts a settle process unless one runs: detached from the
// caller's session, stdio and cgroup, like the lazy-pages daemon.
func (e *Engine) spawnKSMSettle(window time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg, err := json.Marshal(ksmSettleConfig{Layout: e.Store.Layout, CrunRoot: e.Crun.Global.Root, Window: window})
	if err != nil {
		return err
	}
	cmd := exec.Command(self, KSMSettleCommand, string(cfg))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the ksmd settle process: %w", err)
	}
	if err := cgroups.Escape(cmd.Process.Pid); err != nil {
		logrus.Warnf("the ksmd settle process stays in its caller's cgroup: %v", err)
	}
	return cmd.Process.Release()
}

// RunKSMSettleIfAsked is the settle process: one at a time, it waits until
// no merging fork is young, puts ksmd's settings back and exits.
func RunKSMSettleIfAsked() {
	var cfg ksmSettleConfig
	if !fds.HelperArgs(KSMSettleCommand, &cfg, 0) {
		return
	}
	unlock, ok, err := flock.TryLock(filepath.Join(ksmDir(cfg.Layout), "settle.lock"))
	if err != nil || !ok {
		os.Exit(0) // another one settles
	}
	rt, err := crun.Find(crun.Global{Root: cfg.CrunRoot})
	if err != nil {
		os.Exit(1)
	}
	tuner := NewEngine(rt, cfg.Layout).ksmTuner(cfg.Window)
	for {
		next, err := tuner.Settle(time.Now())
		if err != nil {
			unlock()
			os.Exit(1)
		}
		if next == 0 {
			unlock()
			os.Exit(0)
		}
		// A sibling removed early ends its youth: look again soon.
		time.Sleep(min(next, settleLook))
	}
}
