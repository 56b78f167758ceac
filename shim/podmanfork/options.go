// Package podmanfork is the Go client of tclone's API service (`tclone
// service`, which serves Podman's API and adds tclone's endpoints): a fork
// of a running Podman container, and branches (captures kept on disk),
// requested through a Podman connection (bindings.NewConnection) from
// anywhere it reaches: a unix socket the caller may use, or ssh://. It is
// what Podman REST clients and CI pipelines import, and it does no work on
// the host: the service does, through the host agent (shim/hostagent).
//
// The fork rides on Podman's own checkpoint and restore: the source must run
// with `--runtime tclone`; its checkpoint becomes a fork plan kept in memory
// on the host, and each restore makes a real Podman container (its own ID,
// name, IP, hostname, /etc/hosts) that conmon monitors like any other.
//
// Options and BranchOptions are flag tables (see shim/flagtable): their
// tags name the flags of `podman container fork` and `podman container
// branch`, and the query parameters of the service's endpoints.
package podmanfork

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containers/podman/v5/libpod/define"

	"github.com/tclone/tclone/runtime/forkopts"
)

// MaxCount bounds how many siblings one call makes.
const MaxCount = 32

// Options configure a fork. The zero value makes one sibling with a unique
// identity, named <source>-fork-<n>, ready once running.
type Options struct {
	// Fork is what the capture asks of CRIU and how siblings differ from
	// the source (see forkopts.Fork). Its TCP policy is always close:
	// keeping the source's connections (forkopts.TCPKeep, --tcp-established)
	// is refused, since a sibling has its own IP and its copies would talk
	// to the source's peers with the source's address and sequence
	// numbers. Its Uses is Count. Its TTL bounds how long the capture is
	// kept if the call is cut short; 0 means long enough for this call.
	forkopts.Fork
	// Names of the siblings; when empty they are <source>-fork-<n>. When
	// set, its length must equal Count.
	Names []string `flag:"name" usage:"name of the new container (with --count N: NAME-1..NAME-N, or give N names); default SOURCE-fork-<n>"`
	// Count of siblings, 1..MaxCount; 0 means 1. All or nothing.
	Count int `flag:"count" usage:"number of siblings, 1..32, all or nothing"`
	// Publish ports for each sibling, in Podman's -p syntax (with several
	// siblings, leave the host port out so each gets its own). The
	// source's own published ports are never given to a sibling.
	Publish []string `flag:"publish" alias:"p" usage:"publish a port of each sibling (podman -p syntax)"`
	// IgnoreStaticIP and IgnoreStaticMAC let siblings of a source with a
	// static address get fresh ones instead of failing.
	IgnoreStaticIP  bool `flag:"ignore-static-ip" usage:"give siblings of a source with a static IP fresh addresses"`
	IgnoreStaticMAC bool `flag:"ignore-static-mac" usage:"give siblings of a source with a static MAC fresh addresses"`
	// Labels added to every sibling, KEY=VALUE. Siblings always carry
	// LabelForkedFrom.
	Labels Labels `flag:"label" alias:"l" usage:"add a label KEY=VALUE to each sibling"`
	// Hooks run in each sibling, in order, with `sh -c`, before it is
	// reported. A hook that fails fails the whole fork.
	Hooks []string `flag:"hook" usage:"command run with sh -c in each sibling before it is reported; a failure fails the fork"`
	// Ready says when a sibling counts as up; see ParseReady.
	Ready Ready `flag:"ready" usage:"when a sibling is up: running (Podman and crun say it runs; needs nothing in the image), exec (the command true runs in it), tcp:PORT (it accepts a connection) or http:PORT/PATH (GET answers 2xx/3xx)"`
	// ReadyTimeout bounds Hooks plus Ready (and WaitMemory) per sibling;
	// 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration `flag:"ready-timeout" usage:"how long hooks plus readiness may take per sibling (> 0)"`
	// Parallel bounds how many siblings are restored at once; 0 means
	// DefaultParallel.
	Parallel int `flag:"parallel" usage:"restore this many siblings at once, 1..32 (default: one per CPU, up to 4)"`
	// VolumeModes is what siblings get of the source's named volumes: by
	// default a copy each, as they were at the fork instant. Host
	// directories mounted by path are always shared.
	VolumeModes VolumeModes `flag:"volume-mode" group:"volumes" usage:"what siblings get of the source's named volumes: copy (default: a new volume each, <volume>-<sibling>, as it was at the fork instant, removed by podman rm -v), share (the source's own), or NAME=copy|share for one volume; host directories are always shared"`
	// WaitMemory waits, for each sibling, until it has all of its memory
	// (a sibling started with lazy memory runs before), and reports when
	// (Result.MemoryCompleteMs).
	WaitMemory bool `flag:"wait-memory" usage:"report each sibling once it has all of its memory (memory_complete_ms); a lazily started sibling runs before"`
}

// LabelForkedFrom names the label every sibling carries: the source's ID.
const LabelForkedFrom = "io.tclone.forked-from"

// ReadyKind is how readiness is checked.
type ReadyKind string

const (
	ReadyRunning ReadyKind = "running" // Podman reports it running
	ReadyExec    ReadyKind = "exec"    // a command (true) runs in it
	ReadyTCP     ReadyKind = "tcp"     // its PORT accepts a connection
	ReadyHTTP    ReadyKind = "http"    // GET PORT/PATH answers 2xx or 3xx
)

// Ready is a readiness condition.
type Ready struct {
	Kind ReadyKind
	Port int
	Path string
}

func (r Ready) String() string {
	switch r.Kind {
	case ReadyTCP:
		return fmt.Sprintf("tcp:%d", r.Port)
	case ReadyHTTP:
		return fmt.Sprintf("http:%d%s", r.Port, r.Path)
	case "":
		return string(ReadyRunning)
	}
	return string(r.Kind)
}

// MarshalText is the condition as --ready takes it.
func (r Ready) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads running, exec, tcp:PORT or http:PORT/PATH.
func (r *Ready) UnmarshalText(b []byte) error {
	v, err := ParseReady(string(b))
	if err == nil {
		*r = v
	}
	return err
}

var readyRE = regexp.MustCompile(`^(tcp|http):(\d+)(/.*)?$`)

// ParseReady reads running, exec, tcp:PORT or http:PORT/PATH.
func ParseReady(s string) (Ready, error) {
	switch s {
	case "", string(ReadyRunning):
		return Ready{Kind: ReadyRunning}, nil
	case string(ReadyExec):
		return Ready{Kind: ReadyExec}, nil
	}
	m := readyRE.FindStringSubmatch(s)
	if m == nil {
		return Ready{}, fmt.Errorf("invalid readiness %q: use running, exec, tcp:PORT or http:PORT/PATH", s)
	}
	port, err := strconv.Atoi(m[2])
	if err != nil || port < 1 || port > 65535 {
		return Ready{}, fmt.Errorf("invalid readiness %q: port must be 1..65535", s)
	}
	r := Ready{Kind: ReadyKind(m[1]), Port: port, Path: m[3]}
	if r.Kind == ReadyTCP && r.Path != "" {
		return Ready{}, fmt.Errorf("invalid readiness %q: tcp takes a port only", s)
	}
	if r.Kind == ReadyHTTP && r.Path == "" {
		r.Path = "/"
	}
	return r, nil
}

// Labels are KEY=VALUE labels; as a flag, one --label KEY=VALUE each.
type Labels map[string]string

// FlagValues is the labels as KEY=VALUE, by key.
func (l Labels) FlagValues() []string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + l[k]
	}
	return out
}

// SetFlagValues reads KEY=VALUE strings.
func (l *Labels) SetFlagValues(kvs []string) error {
	m, err := parseKV(kvs)
	if err == nil {
		*l = m
	}
	return err
}

func parseKV(kvs []string) (Labels, error) {
	labels := Labels{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid label %q: use KEY=VALUE", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

// checkBranchLabels refuses the labels tclone sets itself, but for
// io.tclone.keep, which a branch may carry.
func checkBranchLabels(labels Labels) error {
	rest := maps.Clone(labels)
	delete(rest, LabelKeep)
	return checkLabels(rest)
}

// LabelKeep marks a branch that prune never removes.
const LabelKeep = "io.tclone.keep"

// Validate checks every option, as a fork would before doing anything, but
// for the ports to publish, which the host agent reads with Podman's own
// parser.
func (o Options) Validate() error {
	return o.Normalize()
}

// Normalize checks every option, as Validate, and fills defaults. The host
// agent runs it before anything is asked of Podman, so a bad option never
// leaves anything behind.
func (o *Options) Normalize() error {
	if o.Count == 0 {
		o.Count = 1
		if len(o.Names) > 1 {
			o.Count = len(o.Names)
		}
	}
	if o.Count < 1 || o.Count > MaxCount {
		return fmt.Errorf("count %d out of range: fork 1 to %d siblings at a time", o.Count, MaxCount)
	}
	if len(o.Names) > 0 && len(o.Names) != o.Count {
		return fmt.Errorf("%d names given for %d siblings; give one name per sibling, or none", len(o.Names), o.Count)
	}
	if err := checkNames(o.Names); err != nil {
		return err
	}
	if o.TCP == forkopts.TCPKeep {
		return errTCPEstablished
	}
	if err := checkLabels(o.Labels); err != nil {
		return err
	}
	for i, h := range o.Hooks {
		if strings.TrimSpace(h) == "" {
			return fmt.Errorf("hook %d is empty: give each --hook a shell command", i+1)
		}
	}
	if o.Ready.Kind == "" {
		o.Ready.Kind = ReadyRunning
	}
	if _, err := ParseReady(o.Ready.String()); err != nil {
		return err
	}
	if o.ReadyTimeout < 0 {
		return fmt.Errorf("ready timeout %s is negative: give how long hooks and readiness may take per sibling", o.ReadyTimeout)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.Parallel < 0 || o.Parallel > MaxCount {
		return fmt.Errorf("parallel %d out of range: restore 1 to %d siblings at a time", o.Parallel, MaxCount)
	}
	if o.Parallel == 0 {
		o.Parallel = DefaultParallel()
	}
	o.Uses = o.Count
	if o.TTL == 0 {
		// Long enough for every sibling, each of which may spend
		// ReadyTimeout on hooks and readiness.
		o.TTL = forkopts.DefaultPlanTTL + time.Duration(o.Count)*(o.ReadyTimeout+time.Minute)
	}
	return o.Fork.Normalize()
}

// DefaultParallel is how many siblings are restored at once by default:
// one per CPU, up to 4 (each restore keeps CRIU and the Podman service
// busy).
func DefaultParallel() int { return min(runtime.NumCPU(), 4) }

// DefaultReadyTimeout bounds hooks plus readiness per sibling by default.
const DefaultReadyTimeout = 60 * time.Second

// CheckName refuses a container name Podman would refuse, with Podman's
// own rule and words.
func CheckName(name string) error {
	if !define.NameRegex.MatchString(name) {
		return fmt.Errorf("invalid container name %q: %w", name, define.RegexError)
	}
	return nil
}

func checkNames(names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if err := CheckName(n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("the name %s is given twice; each sibling needs its own", n)
		}
		seen[n] = true
	}
	return nil
}

// reservedLabelPrefix marks the labels the fork sets itself.
const reservedLabelPrefix = "io.tclone."

func checkLabels(labels Labels) error {
	for k := range labels {
		if k == "" || strings.ContainsAny(k, " \t\n") {
			return fmt.Errorf("invalid label key %q: give KEY=VALUE with a non-empty key without spaces", k)
		}
		if strings.HasPrefix(k, reservedLabelPrefix) {
			return fmt.Errorf("label %s: labels %s* are set by the fork itself", k, reservedLabelPrefix)
		}
	}
	return nil
}

// errTCPEstablished refuses to let Podman siblings keep connections.
var errTCPEstablished = errors.New("--tcp-established cannot be used with podman container fork: each sibling gets its own IP address and network namespace, and its copies of the source's TCP connections would send packets carrying the source's address and sequence numbers to the source's peers. Leave it out: a fork closes the siblings' copies (their processes see the connections end) and the source keeps its connections")
