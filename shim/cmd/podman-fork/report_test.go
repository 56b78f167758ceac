package main

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/podmanfork"
)

// withForkFlags runs action under `podman container fork`'s flags.
func withForkFlags(t *testing.T, action cli.ActionFunc, args ...string) {
	t.Helper()
	app := newApp(plan.LayoutUnder(t.TempDir()))
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	app.Action = action
	if err := app.Run(append([]string{"podman-fork"}, args...)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// A fork prints the new IDs one a line, as podman create does; the
// siblings as JSON with --format json; everything with --print-stats.
func TestReport(t *testing.T) {
	stats := &podmanfork.Stats{Source: "src", Call: "c1", TotalMs: 12,
		Siblings: []*podmanfork.Result{{ID: "id1", Name: "src-fork-1"}, {ID: "id2", Name: "src-fork-2"}}}
	reported := func(args ...string) string {
		return stdout(t, func() {
			withForkFlags(t, func(c *cli.Context) error { return report(c, stats) }, args...)
		})
	}
	if got := reported(); got != "id1\nid2\n" {
		t.Errorf("default report %q, want the IDs one a line", got)
	}
	var siblings []podmanfork.Result
	if err := json.Unmarshal([]byte(reported("--format", "json")), &siblings); err != nil ||
		len(siblings) != 2 || siblings[0].ID != "id1" || siblings[1].Name != "src-fork-2" {
		t.Errorf("--format json: %+v, %v; want the two siblings", siblings, err)
	}
	var all podmanfork.Stats
	if err := json.Unmarshal([]byte(reported("--print-stats", "--format", "json")), &all); err != nil ||
		all.Source != "src" || all.Call != "c1" || all.TotalMs != 12 || len(all.Siblings) != 2 {
		t.Errorf("--print-stats: %+v, %v; want the whole stats", all, err)
	}
}

// --print-stats reports when each sibling's memory was complete, so it
// waits for it as --wait-memory does.
func TestPrintStatsWaitsForMemory(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--print-stats"}, true},
		{[]string{"--wait-memory"}, true},
	} {
		withForkFlags(t, func(ctx *cli.Context) error {
			opts, err := options(ctx)
			if err != nil || opts.WaitMemory != c.want {
				t.Errorf("%v: WaitMemory %v, %v; want %v", c.args, opts.WaitMemory, err, c.want)
			}
			return nil
		}, c.args...)
	}
}
