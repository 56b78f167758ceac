// Package hostlayout hands the host's layout, which each binary's main
// builds once (plan.HostLayout), to the commands of its cli.App.
package hostlayout

import (
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/plan"
)

const key = "tclone.layout"

// Metadata is an app's Metadata holding layout.
func Metadata(layout plan.Layout) map[string]any { return map[string]any{key: layout} }

// Of is the layout of the app c runs in.
func Of(c *cli.Context) plan.Layout { return c.App.Metadata[key].(plan.Layout) }
