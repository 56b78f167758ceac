// Command workload is the in-container workload of tclone's integration
// tests.
//
// `workload serve` sets up a process tree that holds one of every kind of
// resource a container fork has to carry over (memory, threads, open and
// unlinked files with offsets, pipes, socketpairs, listening sockets,
// timerfd, eventfd+epoll, file locks, signal masks, sessions and process
// groups) and keeps it alive. `workload probe`, run next to it (podman exec,
// crun exec), asks serve over a unix control socket what it observes, adds
// what can only be seen from another process (lock ownership, connecting to
// the listening sockets), and prints one JSON report. Comparing the reports
// of a source container and of its forked sibling shows what the fork kept.
//
// Build it static, since it runs in a busybox image without libc:
//
//	CGO_ENABLED=0 go build -o /tmp/workload ./test/workload
//
// and run it, for example:
//
//	podman run -d --name src -v /tmp/workload:/workload:ro localhost/tclone-busybox /workload serve
//	podman exec src /workload probe --hash     # one JSON object on stdout
//	podman exec src /workload mutate --tag x --mem
//	podman exec src /workload eventfd --n 3
//
// serve writes <state-dir>/ready (holding its pid) once everything is set
// up. A report's "errors" lists every problem serve or the client noticed;
// it is empty when everything is as serve built it. Fields that legitimately
// differ between a source and its sibling: hostname, tcp_reply, counters,
// thread counts, timerfd_ticks, max_gap_ms.
//
// Things deliberately avoided because they would add resources these tests
// are not about: os/exec (it keeps a pidfd per child), crypto/rand (vDSO
// getrandom state in MAP_DROPPABLE memory), MPTCP listeners, and the
// runtime's open cgroup files (the go:debug line below).
//
// containermaxprocs=0 keeps the Go runtime (>= 1.25) from holding the
// cgroup's cpu.max (or cfs_quota_us/cfs_period_us) open for the life of
// every process to track GOMAXPROCS: those would be extra open files on
// cgroupfs, outside the resources these tests mean to exercise.
//
//go:debug containermaxprocs=0
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Defaults shared by serve and the client commands, so that inside a
// container no flag is needed at all.
const (
	defaultStateDir   = "/var/tmp/workload"
	defaultUnixSocket = "/var/tmp/workload/listen.sock"
	defaultControl    = "/var/tmp/workload/control.sock"
	defaultTCPPort    = 8080
	defaultMemMiB     = 256
	defaultMemSeed    = 42
)

const usageText = `usage:
  workload serve   [--state-dir DIR] [--mem-mib N] [--mem-seed S] [--tcp-port P]
                   [--unix-socket PATH] [--control PATH]
  workload probe   [--control PATH] [--unix-socket PATH] [--state-dir DIR] [--hash] [--reset-gap]
  workload mutate  [--control PATH] --tag STRING [--mem]
  workload eventfd [--control PATH] --n N
  workload inotify-unlinked [--dir DIR] [--interval D] [--keep-name]

serve runs for ever and holds the resources; the other commands ask it for a
report over the control socket and print it as one JSON object.
inotify-unlinked runs for ever too: it watches a file it has unlinked, keeps
writing to it, and counts the events in DIR/events.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and turns its result into an exit status:
// 0 on success, 1 on a runtime failure, 2 on a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "serve":
		err = cmdServe(rest, stderr)
	case "probe":
		err = cmdProbe(rest, stdout, stderr)
	case "mutate":
		err = cmdMutate(rest, stdout, stderr)
	case "eventfd":
		err = cmdEventfd(rest, stdout, stderr)
	case "inotify-unlinked":
		err = cmdInotifyUnlinked(rest, stderr)
	case childSubcommand:
		err = childMain(rest)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "workload: unknown command %q\n%s", cmd, usageText)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "workload %s: %v\n", cmd, err)
		return 2
	default:
		fmt.Fprintf(stderr, "workload %s: %v\n", cmd, err)
		return 1
	}
}

// usageError marks errors caused by how the command was invoked.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// parseFlags parses args into fs and rejects positional arguments, which no
// subcommand takes.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
