package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/tclone/tclone/criuhooks"
	"github.com/tclone/tclone/criuhooks/lazypages"
	"github.com/tclone/tclone/kernel/cherrypick"
)

// dumped is the "dumped" line: what the copy-on-write dump cost the source.
type dumped struct {
	// DumpMs is the whole CRIU call. CRIU's own frozen time is useless for
	// a lazy dump: its page server starts its statistics again
	// (init_stats in cr_page_server), so the frozen time it writes counts
	// from zero. The source's pause is best seen from inside it.
	DumpMs float64 `json:"dump_ms"`
	// SnapshotMs is the part of it the snapshots took.
	SnapshotMs float64 `json:"snapshot_ms"`
	// PagesWritten is what CRIU still wrote to its pages images (the
	// eager pages: stacks, private file pages).
	PagesWritten uint64 `json:"pages_written"`
	// SnapshotPages is what the snapshots hold.
	SnapshotPages uint64 `json:"snapshot_pages"`
	Processes     int    `json:"processes"`
}

// cowDump dumps the tree of pid into dir, lazily, with a snapshot of each
// process taken in post-dump, and reports it on stdout.
func cowDump(criuPath, dir string, pid int) (*criuhooks.Snapshots, error) {
	dev, err := cherrypick.Open()
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	imgDir, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer imgDir.Close()
	opts := &rpc.CriuOpts{
		ImagesDirFd:  proto.Int32(int32(imgDir.Fd())),
		Pid:          proto.Int32(int32(pid)),
		LeaveRunning: proto.Bool(true),
		LogFile:      proto.String("dump.log"),
		LogLevel:     proto.Int32(4),
	}
	release, err := criuhooks.LazyDump(opts, dir, false)
	if err != nil {
		return nil, err
	}
	defer release()
	var snaps *criuhooks.Snapshots
	var tasks int
	hooks := &criuhooks.CaptureHooks{OnPostDump: func() error {
		t, err := criuhooks.TreeTasks(pid)
		if err != nil {
			return err
		}
		tasks = len(t)
		snaps, err = criuhooks.SnapshotTree(dev, t)
		return err
	}}
	start := time.Now()
	req := criuhooks.Request{CriuPath: criuPath, Opts: opts, LogPath: filepath.Join(dir, "dump.log"), Timeout: 2 * time.Minute}
	if err := criuhooks.Dump(context.Background(), req, hooks); err != nil {
		if snaps != nil {
			snaps.Close()
		}
		return nil, err
	}
	// CRIU's statistics cannot say (see DumpMs): the pages images can.
	written, err := lazypages.PagesBytes(dir)
	if err != nil {
		snaps.Close()
		return nil, err
	}
	d := dumped{
		DumpMs:        float64(time.Since(start).Microseconds()) / 1000,
		SnapshotMs:    float64(snaps.Took.Microseconds()) / 1000,
		PagesWritten:  written / uint64(os.Getpagesize()),
		SnapshotPages: snaps.AnonPages + snaps.SwapEntries,
		Processes:     tasks,
	}
	if err := json.NewEncoder(os.Stdout).Encode(line{Event: lazypages.Event{Kind: "dumped"}, At: time.Now().UnixNano(), Dump: &d}); err != nil {
		snaps.Close()
		return nil, fmt.Errorf("report the dump: %w", err)
	}
	return snaps, nil
}
