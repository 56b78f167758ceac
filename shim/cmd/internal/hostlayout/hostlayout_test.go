package hostlayout

import (
	"io"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/plan"
)

// A command reads the layout its app was made with.
func TestOf(t *testing.T) {
	want := plan.LayoutUnder(t.TempDir())
	var got plan.Layout
	app := &cli.App{Metadata: Metadata(want), Writer: io.Discard,
		Commands: []*cli.Command{{Name: "x", Action: func(c *cli.Context) error { got = Of(c); return nil }}}}
	if err := app.Run([]string{"t", "x"}); err != nil || got != want {
		t.Fatalf("layout %+v, %v; want %+v", got, err, want)
	}
}
