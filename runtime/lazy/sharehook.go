package lazy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tclone/tclone/criuhooks/lazypages"
)

// EnvShareHook, in the environment of a copy-on-write restore's CRIU,
// holds the share hook's configuration: the tclone binary, run by CRIU as
// its action script (ShareHook), then acts as the hook.
const EnvShareHook = "TCLONE_SHARE_HOOK"

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

// ShareHook sets up the action script a copy-on-write restore gives CRIU:
// at pre-resume, while CRIU holds the restored tasks stopped, it asks the
// plan's daemon (whose paths are p) to share the snapshots' pages with
// them. The script is the tclone binary itself (no file is written, so
// that a noexec mount cannot stop it), told what to do by env, which the
// restore's CRIU must inherit. The hook's ShareResult goes to a file in
// dir, returned as stats.
func ShareHook(dir string, p Paths) (script, env, stats string, err error) {
	if script, err = os.Executable(); err != nil {
		return "", "", "", err
	}
	stats = filepath.Join(dir, "tclone-share.json")
	cfg, err := json.Marshal(shareHookConfig{Control: p.Control, Stats: stats})
	if err != nil {
		return "", "", "", err
	}
	return script, EnvShareHook + "=" + string(cfg), stats, nil
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

// RunShareHookIfAsked runs the share hook and exits when CRIU runs tclone
// as a copy-on-write restore's action script. CRIU names the action in
// CRTOOLS_SCRIPT_ACTION, and the restored tree's root in CRTOOLS_INIT_PID;
// every action but pre-resume is nothing to do. A failed share exits 1,
// which CRIU logs and ignores: the daemon's guard kills a sibling left
// without memory, and the restore reads the result.
func RunShareHookIfAsked() {
	conf, action := os.Getenv(EnvShareHook), os.Getenv("CRTOOLS_SCRIPT_ACTION")
	if conf == "" || action == "" {
		return
	}
	if action != "pre-resume" {
		os.Exit(0)
	}
	var cfg shareHookConfig
	var r ShareResult
	err := json.Unmarshal([]byte(conf), &cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tclone: copy-on-write share: %s: %v\n", EnvShareHook, err)
		os.Exit(1)
	}
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
