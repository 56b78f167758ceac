// Command lazypagesd runs tclone's lazy-pages daemon on its own, for tests
// and measurements against raw CRIU:
//
//	lazypagesd -images DIR [-socket PATH]... [-siblings N] [-dump PID [-criu PATH]]
//
// With -share-wait and -control PATH, the snapshots' pages are shared
// with the siblings instead of copied (lazypages.Daemon.Share), when asked
// over the control socket: a restore gives CRIU, as its action script,
//
//	lazypagesd -hook-share PATH
//
// which asks at pre-resume, while CRIU holds the tasks stopped.
//
// With -dump it first makes the dump itself, copy-on-write: a --lazy-pages
// dump of the tree of PID (left running) into DIR, with a vma_cherrypick
// snapshot of each process taken while the tree is frozen
// (criuhooks.LazyDump, SnapshotTree), and then serves lazy pages from the
// snapshots. Its first line is then a "dumped" event with the pause's
// figures.
//
// It serves every `criu restore --lazy-pages` that connects at one of the
// sockets (default DIR/lazy-pages.socket), writes one JSON object per event
// on stdout (the first one, "listening", once restores may start), and
// exits when N siblings are done, or on SIGTERM/SIGINT, killing siblings
// whose memory is not complete. It exits 1 if a sibling failed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tclone/tclone/criuhooks/lazypages"
)

type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(s string) error { *p = append(*p, s); return nil }

// line is one line of output.
type line struct {
	lazypages.Event
	At    int64   `json:"at_ns"`
	Error string  `json:"error,omitempty"`
	Dump  *dumped `json:"dump,omitempty"`
}

func main() {
	images := flag.String("images", "", "the dump's images directory")
	siblings := flag.Int("siblings", 0, "exit once this many siblings are done (0: run until signalled)")
	pause := flag.Duration("chunk-pause", 0, "wait this long between background chunks")
	dumpPid := flag.Int("dump", 0, "first dump the tree of this pid copy-on-write into -images")
	criuPath := flag.String("criu", "criu", "the criu binary, for -dump")
	var sockets paths
	flag.Var(&sockets, "socket", "listen here (repeatable; default IMAGES/"+lazypages.SocketName+")")
	shareWait := flag.Duration("share-wait", 0, "with -dump: wait this long for a share request before copying")
	control := flag.String("control", "", "with -share-wait: accept share requests at this socket")
	sharePause := flag.Duration("share-pause", 0, "wait this long between unregistering an area and sharing it")
	hook := flag.String("hook-share", "", "run as CRIU's action script: at pre-resume, ask the daemon at this control socket to share")
	flag.Parse()
	if *hook != "" {
		os.Exit(hookShare(*hook))
	}
	if *images == "" {
		fail(fmt.Errorf("-images is required"))
	}
	if len(sockets) == 0 {
		sockets = paths{filepath.Join(*images, lazypages.SocketName)}
	}
	opts := lazypages.Options{ImagesDir: *images, ChunkPause: *pause}
	if *dumpPid != 0 {
		snaps, err := cowDump(*criuPath, *images, *dumpPid)
		if err != nil {
			fail(err)
		}
		defer snaps.Close()
		opts.Snapshots = snaps.Files
		opts.ShareWait = *shareWait
		opts.SharePause = *sharePause
	}
	os.Exit(run(opts, sockets, *siblings, *control))
}

func run(opts lazypages.Options, sockets []string, want int, control string) int {
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(ev lazypages.Event) {
		mu.Lock()
		defer mu.Unlock()
		l := line{Event: ev, At: time.Now().UnixNano()}
		if ev.Err != nil {
			l.Error = ev.Err.Error()
		}
		enc.Encode(l)
	}
	done := make(chan lazypages.Event, 1024)
	opts.OnEvent = func(ev lazypages.Event) {
		emit(ev)
		if ev.Kind == lazypages.EventComplete || ev.Kind == lazypages.EventFailed {
			done <- ev
		}
	}
	d, err := lazypages.Start(opts)
	if err != nil {
		fail(err)
	}
	for _, s := range sockets {
		if err := d.Listen(s); err != nil {
			d.Close()
			fail(err)
		}
	}
	if control != "" {
		if err := serveControl(d, control); err != nil {
			d.Close()
			fail(err)
		}
	}
	emit(lazypages.Event{Kind: "listening"})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	status := 0
wait:
	for n := 0; want == 0 || n < want; n++ {
		select {
		case ev := <-done:
			if ev.Kind == lazypages.EventFailed {
				status = 1
			}
		case <-sig:
			status = 1
			break wait
		}
	}
	if err := d.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "lazypagesd: %v\n", err)
		status = 1
	}
	return status
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "lazypagesd: %v\n", err)
	os.Exit(2)
}
