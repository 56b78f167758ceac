package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clientOptions are the flags every client command (probe, mutate,
// eventfd) shares.
type clientOptions struct {
	control    string
	unixSocket string
	stateDir   string
	timeout    time.Duration
	fs         *flag.FlagSet
}

func newClientFlags(name string, stderr io.Writer) *clientOptions {
	o := &clientOptions{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	o.fs.SetOutput(stderr)
	o.fs.StringVar(&o.control, "control", defaultControl, "path of serve's control socket")
	// Empty defaults mean "the path serve reports", which is the default
	// path unless serve was started with another one.
	o.fs.StringVar(&o.unixSocket, "unix-socket", "",
		"serve's listening unix socket to connect to (default: the one serve reports, normally "+defaultUnixSocket+")")
	o.fs.StringVar(&o.stateDir, "state-dir", "",
		"serve's state directory, for the lock checks (default: the one serve reports, normally "+defaultStateDir+")")
	o.fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on serve's answer (hashing a big region is slow)")
	return o
}

// observePaths returns the listening socket and state directory to check:
// the flags if given, else what serve reports, so that only --control is
// needed for a serve started with non-default paths.
func (o *clientOptions) observePaths(r *Report) (unixSocket, stateDir string) {
	return firstNonEmpty(o.unixSocket, r.UnixSocket, defaultUnixSocket),
		firstNonEmpty(o.stateDir, r.StateDir, defaultStateDir)
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

func cmdProbe(args []string, stdout, stderr io.Writer) error {
	o := newClientFlags("probe", stderr)
	hash := o.fs.Bool("hash", false, "include the sha256 of the memory region (slow for big regions)")
	resetGap := o.fs.Bool("reset-gap", false, "reset max_gap_ms after reading it")
	if err := parseFlags(o.fs, args); err != nil {
		return err
	}
	return o.run(controlRequest{Op: opReport, Hash: *hash, ResetGap: *resetGap}, stdout)
}

func cmdMutate(args []string, stdout, stderr io.Writer) error {
	o := newClientFlags("mutate", stderr)
	tag := o.fs.String("tag", "", "new content of the tag page, also appended to mutations.log (required)")
	mem := o.fs.Bool("mem", false, "also rewrite the first 4 KiB of the memory region (the report then includes its hash)")
	if err := parseFlags(o.fs, args); err != nil {
		return err
	}
	if err := validateTag(*tag); err != nil {
		return usagef("--tag: %v", err)
	}
	return o.run(controlRequest{Op: opMutate, Tag: *tag, Mem: *mem}, stdout)
}

func cmdEventfd(args []string, stdout, stderr io.Writer) error {
	o := newClientFlags("eventfd", stderr)
	n := o.fs.Int("n", 0, "number of times serve writes 1 to its eventfd (required)")
	if err := parseFlags(o.fs, args); err != nil {
		return err
	}
	if *n < 1 || *n > maxEventfdWrites {
		return usagef("--n must be between 1 and %d", maxEventfdWrites)
	}
	return o.run(controlRequest{Op: opEventfd, N: *n}, stdout)
}

// run sends req, adds this process's own observations and prints the
// report.
func (o *clientOptions) run(req controlRequest, stdout io.Writer) error {
	r, err := callServe(o.control, req, o.timeout)
	if err != nil {
		return err
	}
	unixSocket, stateDir := o.observePaths(r)
	observeFromOutside(r, unixSocket, stateDir)
	// One line, so a harness can also take the last line of the output.
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// outsideTimeout bounds each connection the client makes to serve's
// listening sockets.
const outsideTimeout = 2 * time.Second

// observeFromOutside fills in what only a process other than serve can
// observe: who holds the locks, and whether the listening sockets answer.
func observeFromOutside(r *Report, unixSocket, stateDir string) {
	held, err := checkFlock(filepath.Join(stateDir, flockFileName))
	r.FlockHeld = held
	switch {
	case err != nil:
		r.addError("flock check: %v", err)
	case !held:
		r.addError("nobody holds the flock on %s", filepath.Join(stateDir, flockFileName))
	}

	pid, err := checkPosixLock(filepath.Join(stateDir, posixLockName))
	r.PosixLockHeld, r.PosixLockPID = pid != 0, pid
	switch {
	case err != nil:
		r.addError("POSIX lock check: %v", err)
	case pid == 0:
		r.addError("nobody holds the POSIX lock on %s", filepath.Join(stateDir, posixLockName))
	case pid != r.PID:
		r.addError("the POSIX lock on %s is held by pid %d, not serve (%d)", filepath.Join(stateDir, posixLockName), pid, r.PID)
	}

	if err := unixEchoRoundtrip(unixSocket); err != nil {
		r.addError("unix socket %s: %v", unixSocket, err)
	} else {
		r.UnixListenRoundtrip = true
	}

	reply, err := tcpReply(net.JoinHostPort("127.0.0.1", strconv.Itoa(r.TCPPort)))
	r.TCPReply = reply
	if err != nil {
		r.addError("TCP port %d: %v", r.TCPPort, err)
	} else if problem := checkTCPReply(reply, r.Hostname); problem != "" {
		r.addError("%s", problem)
	}
}

// unixEchoRoundtrip sends a random line to serve's echo socket and checks
// it comes back.
func unixEchoRoundtrip(path string) error {
	conn, err := net.DialTimeout("unix", path, outsideTimeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(outsideTimeout))
	token := randomHex(16)
	if _, err := io.WriteString(conn, token+"\n"); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if got := strings.TrimSuffix(line, "\n"); got != token {
		return fmt.Errorf("echoed %q, want %q", got, token)
	}
	return nil
}

// tcpReply returns the line serve's TCP listener answers, without its
// newline.
func tcpReply(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, outsideTimeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(outsideTimeout))
	b, err := io.ReadAll(io.LimitReader(conn, 4096))
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}
