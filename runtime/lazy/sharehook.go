package lazy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/runtime/internal/fds"
)

// ShareHookCommand is the hidden argv[1] under which the tclone binary runs
// as a copy-on-write restore's CRIU action script (WriteShareHook).
const ShareHookCommand = "__tclone-lazy-share"

// shareHookName is the script CRIU runs, in the sibling's directory.
const shareHookName = "tclone-share-hook"

// shareHookConfig is what the hook is started with.
type shareHookConfig struct {
	// Control is the plan daemon's control socket.
	Control string `json:"control"`
	// Stats is where the hook writes what was shared (ShareResult).
	Stats string `json:"stats"`
}

// ShareResult is what a copy-on-write sibling's share did, as its hook
// wrote it.
type ShareResult struct {
	lazypages.ShareStats
	// Error is why the share failed: the daemon did not answer, or an
	// area could be neither shared nor copied (the sibling is then killed
	// by the daemon's guard).
	Error string `json:"error,omitempty"`
}

// WriteShareHook writes, in dir, the action script a copy-on-write
// restore gives CRIU: at pre-resume, while CRIU holds the restored tasks
// stopped, it asks the plan's daemon (whose paths are p) to share the
// snapshots' pages with them. It returns the script's path and the file
// the hook's ShareResult goes to. CRIU runs action scripts itself, with
// no argument, so the script names the tclone binary and its
// configuration.
func WriteShareHook(dir string, p Paths) (script, stats string, err error) {
	self, err := os.Executable()
	if err != nil {
		return "", "", err
	}
	stats = filepath.Join(dir, "tclone-share.json")
	cfg, err := json.Marshal(shareHookConfig{Control: p.Control, Stats: stats})
	if err != nil {
		return "", "", err
	}
	script = filepath.Join(dir, shareHookName)
	body := fmt.Sprintf("#!/bin/sh\nexec %s %s %s\n", shellQuote(self), ShareHookCommand, shellQuote(string(cfg)))
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		return "", "", fmt.Errorf("writing the copy-on-write restore's hook: %w", err)
	}
	return script, stats, nil
}

// ReadShareResult reads what a sibling's share hook wrote; nil when it
// never ran (CRIU failed before pre-resume).
func ReadShareResult(path string) (*ShareResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var r ShareResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("the share hook's result %s: %w", path, err)
	}
	return &r, nil
}

// RunShareHookIfAsked runs the share hook and exits when argv asks for it.
// CRIU names the action in CRTOOLS_SCRIPT_ACTION, and the restored tree's
// root in CRTOOLS_INIT_PID; every action but pre-resume is nothing to do.
// A failed share exits 1, which CRIU logs and ignores: the daemon's guard
// kills a sibling left without memory, and the restore reads the result.
func RunShareHookIfAsked() {
	var cfg shareHookConfig
	if !fds.HelperArgs(ShareHookCommand, &cfg, 2) {
		return
	}
	if os.Getenv("CRTOOLS_SCRIPT_ACTION") != "pre-resume" {
		os.Exit(0)
	}
	var r ShareResult
	answer, err := Ask(Paths{Control: cfg.Control}, "share "+os.Getenv("CRTOOLS_INIT_PID"))
	if err == nil {
		err = json.Unmarshal([]byte(answer), &r.ShareStats)
	}
	if err != nil {
		r.Error = err.Error()
	}
	b, _ := json.Marshal(r)
	if werr := os.WriteFile(cfg.Stats, b, 0o600); werr != nil || err != nil {
		fmt.Fprintf(os.Stderr, "tclone: copy-on-write share: %v %v\n", err, werr)
		os.Exit(1)
	}
	os.Exit(0)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
