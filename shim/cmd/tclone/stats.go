package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/memuse"
)

var statsCommand = &cli.Command{
	Name:      "stats",
	Usage:     "print what containers cost in memory (RSS, PSS, KSM), once or over time",
	ArgsUsage: "ID...",
	Description: `Prints one JSON line per container and sample: its processes' resident
(rss_kib) and proportional (pss_kib) set sizes, the dirty memory no other
process maps (private_dirty_kib: what a sibling owns alone), the pages the kernel's
samepage merging shares of them (ksm_merging_pages) and how many of its
processes are mergeable as a whole (ksm_merge_any). A sibling's PSS falls
below its RSS as it shares pages with its source: copy-on-write, or merged
by KSM (--memory ksm). With --interval, samples until --duration ends.`,
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "interval", Usage: "sample every INTERVAL (default: once)"},
		&cli.DurationFlag{Name: "duration", Value: time.Minute, Usage: "how long to sample with --interval"},
	},
	Action: func(c *cli.Context) error {
		if c.NArg() == 0 {
			return fmt.Errorf("stats takes one or more container IDs")
		}
		interval := c.Duration("interval")
		if c.IsSet("interval") && interval <= 0 {
			return fmt.Errorf("--interval %s: give a duration above zero, such as 1s", interval)
		}
		rt, err := findCrun(c)
		if err != nil {
			return err
		}
		start := time.Now()
		enc := json.NewEncoder(os.Stdout)
		for {
			for _, id := range c.Args().Slice() {
				st, err := rt.State(c.Context, id)
				if err != nil {
					return err
				}
				u, err := memuse.Tree(st.Pid)
				if err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				if err := enc.Encode(struct {
					ID        string  `json:"id"`
					ElapsedMs float64 `json:"elapsed_ms"`
					memuse.Usage
				}{id, float64(time.Since(start).Microseconds()) / 1000, u}); err != nil {
					return err
				}
			}
			if interval == 0 || time.Since(start)+interval > c.Duration("duration") {
				return nil
			}
			select {
			case <-c.Context.Done():
				return nil
			case <-time.After(interval):
			}
		}
	},
}
