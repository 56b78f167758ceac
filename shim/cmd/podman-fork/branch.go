package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/branch/signing"
	"github.com/tclone/tclone/runtime/buildinfo"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/cmd/internal/hostlayout"
	"github.com/tclone/tclone/shim/forkflags/podmanflags"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// BranchCommand is the name this binary answers `podman container branch`
// by: the podman wrapper runs it through a link of that name.
const BranchCommand = "podman-branch"

func newBranchApp(layout plan.Layout) *cli.App {
	debug := &cli.BoolFlag{Name: "debug", Usage: "debug output"}
	return &cli.App{
		Metadata: hostlayout.Metadata(layout),
		Name:     "podman container branch",
		Usage:    "keep named captures of running containers on disk, and start containers from them",
		Description: `A branch is a container's whole state at one instant (process tree,
memory, files, volumes), written to disk after the container runs on.
Containers started from it begin from that instant, any number of times,
also after the container is gone or the host rebooted. The container must
run with --runtime tclone. Branches are kept in ` + layout.Branches + `
(TCLONE_BRANCH_DIR); their memory is stored once for all of them.`,
		Version: buildinfo.Version,
		// Branches live on the Podman host, so the command runs there; it
		// may name the local Podman service's socket.
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", EnvVars: []string{"CONTAINER_HOST"}, Usage: "the local Podman service's socket, unix:///PATH (default: the system service, or one started for this call)"},
			&cli.StringFlag{Name: "connection", Aliases: []string{"c"}, Hidden: true},
			&cli.StringFlag{Name: "ssh-identity", Hidden: true},
			&cli.BoolFlag{Name: "debug", Usage: "debug output"},
		},
		Before: func(c *cli.Context) error {
			if u := c.String("url"); c.String("connection") != "" || c.String("ssh-identity") != "" || (u != "" && !strings.HasPrefix(u, "unix://")) {
				return fmt.Errorf("podman container branch runs on the Podman host, where its branches are kept: run it there (--url may only name a local unix:// socket)")
			}
			return nil
		},
		HideHelpCommand:           true,
		DisableSliceFlagSeparator: true,
		OnUsageError:              usageError,
		Commands: []*cli.Command{
			{
				Name:         "create",
				OnUsageError: usageError,
				Usage:        "capture a running container as a branch",
				ArgsUsage:    "SOURCE NAME",
				Flags: append(podmanflags.BranchCreate(),
					&cli.StringFlag{Name: "wait", Value: "durable", Usage: "durable: return once the branch is on disk; runnable: once the source is captured and runs on, the branch being written in the background (ls shows it writing; a start waits for it)"},
					&cli.IntFlag{Name: notifyFlag, Hidden: true},
					&cli.BoolFlag{Name: "print-stats", Usage: "print the branch and its timings as JSON instead of its ID"},
					debug,
				),
				Action: branchCreate,
			},
			{
				Name:         "ls",
				OnUsageError: usageError,
				Aliases:      []string{"list"},
				Usage:        "list branches, of one source if given",
				ArgsUsage:    "[SOURCE]",
				Flags:        []cli.Flag{&cli.StringFlag{Name: "format", Usage: "json prints the branches as a JSON array"}, debug},
				Action:       branchList,
			},
			{
				Name:         "inspect",
				OnUsageError: usageError,
				Usage:        "print branches as JSON",
				ArgsUsage:    "NAME...",
				Flags:        []cli.Flag{debug},
				Action:       branchInspect,
			},
			{
				Name:         "start",
				OnUsageError: usageError,
				Usage:        "start new containers from a branch",
				ArgsUsage:    "NAME",
				Description: `Starts containers from the branch as podman container fork does from a
running container, with the same options and the same all-or-nothing rule.
They carry the label ` + podmanfork.LabelBranch + `=<branch ID>. Prints their IDs.`,
				Flags: append(podmanflags.PodmanBranchStart(),
					&cli.BoolFlag{Name: "print-stats", Usage: "print the start's timings as JSON instead of the IDs"},
					&cli.StringFlag{Name: "format", Usage: "json prints the new containers as a JSON array"},
					debug),
				Action: branchStart,
			},
			{
				Name:         "rm",
				OnUsageError: usageError,
				Aliases:      []string{"remove"},
				Usage:        "remove branches; containers started from them are not touched",
				ArgsUsage:    "NAME...",
				Flags:        []cli.Flag{debug},
				Action:       branchRemove,
			},
			{
				Name:         "prune",
				OnUsageError: usageError,
				Usage:        "remove old branches: lists what would go unless --yes",
				Description: `Of the branches selected (all, or of --source, or named --name-prefix*),
removes those not among the --keep-last newest of their source and older
than --older-than. Without --yes it only lists them, why, and the disk space
they would free. A branch labelled ` + podmanfork.LabelKeep + `=true is never removed.`,
				Flags: append(podmanflags.BranchPrune(),
					&cli.StringFlag{Name: "format", Usage: "json prints the plan as JSON"},
					debug,
				),
				Action: branchPrune,
			},
			{
				Name:         "diff",
				OnUsageError: usageError,
				Usage:        "show what differs from branch A to branch B",
				ArgsUsage:    "A B",
				Description: `Shows how the branches are related, their labels, sizes (and what B
shares with A), their processes, and the root filesystem paths B added (A),
deleted (D) or changed (C) relative to A, as podman diff does.`,
				Flags:  []cli.Flag{&cli.StringFlag{Name: "format", Usage: "json prints the difference as JSON"}, debug},
				Action: branchDiff,
			},
			{
				Name:         "export",
				OnUsageError: usageError,
				Usage:        "write a branch to one file (tar + zstd), or as a checkpoint image (--image)",
				ArgsUsage:    "NAME FILE | --image IMAGE NAME",
				Description: `Without --image, writes the branch, signed with this host's key, to FILE,
which podman container branch import reads on another host.

With --image, writes it as a checkpoint image in the local image store, in
the format of podman container checkpoint --create-image: push it with
podman push, and restore it on any host with podman container restore IMAGE
(the image's io.tclone.restore-flags annotation says which flags the
restore needs; they are also printed), or import it as a branch there with
podman container branch import --image IMAGE. The image holds the branch's
processes, memory, root filesystem changes, /dev/shm and copied volumes;
the image the container ran from must be on the restoring host, or
pullable by its name.

With --parent-image PARENT, a checkpoint image this host exported (without
--parent-image) from an earlier branch of the same container, the new image
is PARENT plus one layer holding only what changed since: the memory pages
that differ, and the files that do. A registry that has PARENT stores and
serves only that layer; stock podman container restore and branch import
read the image as a whole, as any other.`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "image", Usage: "write a checkpoint image of this name instead of a file"},
					&cli.StringFlag{Name: "parent-image", Usage: "with --image: write only what changed since this checkpoint image, exported here from an earlier branch of the same container, as a layer over it"},
					&cli.StringFlag{Name: "format", Usage: "with --image: json prints what was written (image, ID, layer size, restore flags, notes, time) as JSON"},
					debug},
				Action: branchExport,
			},
			{
				Name:         "import",
				OnUsageError: usageError,
				Usage:        "read a branch from a file or a checkpoint image (--image) written by export; its image must be on this host",
				ArgsUsage:    "FILE | --image IMAGE",
				Description: `The archive must be signed by a key this host trusts: its own, one given
with --trust, or one in ` + layout.TrustedKeys + ` (a file KEY.pub a key, root's,
writable by root only). An export is signed by its host's key; that host
prints it with podman container branch key.`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "name the branch (default: its name when exported)"},
					&cli.StringFlag{Name: "image", Usage: "read the checkpoint image of this name (written by export --image; pulled if this host lacks it) instead of a file"},
					&cli.BoolFlag{Name: "tls-verify", Value: true, Usage: "with --image: require HTTPS and verify certificates when pulling it"},
					&cli.StringSliceFlag{Name: "trust", Usage: "trust this public key (as podman container branch key prints it, or a file holding it) for this import (repeatable)"},
					&cli.BoolFlag{Name: "insecure-unsigned", Usage: "import an archive that is unsigned or signed by a key this host does not trust: its processes then run from images no one vouches for"},
					debug},
				Action: branchImport,
			},
			{
				Name:         "key",
				OnUsageError: usageError,
				Usage:        "print this host's public signing key (made on first use), which other hosts trust to import its exports",
				Flags:        []cli.Flag{debug},
				Action:       branchKey,
			},
		},
	}
}

// usageError makes a wrong flag an error that says so, not a page of help.
func usageError(_ *cli.Context, err error, _ bool) error {
	return fmt.Errorf("%w; see --help", err)
}

// begin starts a branch command that prints in --format: debug output as
// asked, its arguments counted (ok says whether their number is right;
// takes says what the command takes), and --format read.
func begin(c *cli.Context, ok func(n int) bool, takes string) (format string, err error) {
	setDebug(c)
	if !ok(c.NArg()) {
		return "", fmt.Errorf("podman container branch %s takes %s; see --help", c.Command.Name, takes)
	}
	return readFormat(c)
}

func setDebug(c *cli.Context) {
	if c.Bool("debug") {
		logrus.SetLevel(logrus.DebugLevel)
	}
}

// printJSON writes v as indented JSON in one write.
func printJSON(v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := os.Stdout.Write(buf.Bytes())
	return err
}

func branchCreate(c *cli.Context) error {
	setDebug(c)
	if c.NArg() != 2 {
		return fmt.Errorf("podman container branch create takes SOURCE and NAME; see --help")
	}
	opts, err := podmanflags.ReadBranchCreate(c)
	if err != nil {
		return err
	}
	if err := branch.CheckName(c.Args().Get(1)); err != nil {
		return err
	}
	switch w := c.String("wait"); {
	case w == "runnable" && c.Bool("print-stats"):
		return fmt.Errorf("--print-stats needs --wait durable: the timings are known once the branch is on disk")
	case w == "runnable":
		return createInBackground(c)
	case w != "durable":
		return fmt.Errorf("--wait %s: give runnable (return once the source is captured and runs on; the branch is written after) or durable (once it is on disk)", w)
	}
	notify, err := notifier(c)
	if err != nil {
		return err
	}
	var runnable func(*branch.Branch) error
	if notify.f != nil {
		runnable = notify.runnable
	}
	ctx, stop, err := connectTo(c.Context, hostlayout.Of(c), target{url: c.String("url")}, false)
	if err != nil {
		notify.failed(err)
		return err
	}
	defer stop()
	st, err := agentOf(c).CreateBranch(ctx, c.Args().Get(0), c.Args().Get(1), opts, runnable)
	if err != nil {
		notify.failed(err)
		return err
	}
	if c.Bool("print-stats") {
		return printJSON(st)
	}
	_, err = fmt.Println(st.Branch.ID)
	return err
}

func branchList(c *cli.Context) error {
	format, err := begin(c, func(n int) bool { return n <= 1 }, "at most one SOURCE")
	if err != nil {
		return err
	}
	infos, err := agentOf(c).Branches().ListOf(c.Args().First())
	if err != nil {
		return err
	}
	if format == "json" {
		return printJSON(infos)
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSOURCE\tSTATE\tCREATED\tPROCESSES\tMEMORY\tPARENT")
	for _, in := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", in.Name, in.ID, in.Source.Name, in.State,
			in.CreatedAt.Local().Format(time.DateTime), in.Plan.Tree.Processes, humanBytes(in.Size.Files), in.Parent)
	}
	tw.Flush()
	_, err = os.Stdout.Write(buf.Bytes())
	return err
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func branchInspect(c *cli.Context) error {
	setDebug(c)
	if c.NArg() == 0 {
		return fmt.Errorf("podman container branch inspect takes one or more branch names or IDs; see --help")
	}
	store := agentOf(c).Branches()
	var out []*branch.Branch
	for _, ref := range c.Args().Slice() {
		b, err := store.Get(ref)
		if err != nil {
			return err
		}
		b.Engine = nil // the engine's own copy of the source's inspection
		out = append(out, b)
	}
	return printJSON(out)
}

func branchStart(c *cli.Context) error {
	if _, err := begin(c, func(n int) bool { return n == 1 }, "exactly one branch NAME"); err != nil {
		return err
	}
	opts, err := podmanflags.ReadBranchStart(c)
	if err != nil {
		return err
	}
	// --print-stats reports when each container's memory was complete.
	opts.WaitMemory = opts.WaitMemory || c.Bool("print-stats")
	if err := hostagent.Validate(opts); err != nil {
		return err
	}
	ctx, stop, err := connectTo(c.Context, hostlayout.Of(c), target{url: c.String("url")}, false)
	if err != nil {
		return err
	}
	defer stop()
	stats, err := agentOf(c).StartBranch(ctx, c.Args().First(), opts)
	if err != nil {
		return err
	}
	return report(c, stats)
}

func branchRemove(c *cli.Context) error {
	setDebug(c)
	if c.NArg() == 0 {
		return fmt.Errorf("podman container branch rm takes one or more branch names or IDs; see --help")
	}
	rep, err := agentOf(c).Branches().Remove(c.Args().Slice()...)
	for _, name := range rep.Branches {
		fmt.Println(name)
	}
	if rep.ChunksBusy {
		logrus.Infof("another branch is being written or read: its unused data is freed by the next rm or tclone gc")
	}
	return err
}

func branchPrune(c *cli.Context) error {
	format, err := begin(c, func(n int) bool { return n == 0 }, "no arguments (select with --source and --name-prefix)")
	if err != nil {
		return err
	}
	rule, yes, err := podmanflags.ReadBranchPrune(c)
	if err != nil {
		return err
	}
	store := agentOf(c).Branches()
	plan, err := store.Prune(rule, time.Now(), yes)
	if err != nil {
		return err
	}
	if format == "json" {
		return printJSON(plan)
	}
	var buf bytes.Buffer
	verb := "would remove"
	if yes {
		verb = "removed"
	}
	tw := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSOURCE\tCREATED\tWHY")
	for _, r := range plan.Remove {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.ID, r.Source, r.Since.Local().Format(time.DateTime), r.Why)
	}
	tw.Flush()
	fmt.Fprintf(&buf, "%s %d branch(es), freeing %s\n", verb, len(plan.Remove), humanBytes(plan.Bytes))
	if len(plan.Kept) > 0 {
		fmt.Fprintf(&buf, "kept by their %s label: %s\n", podmanfork.LabelKeep, strings.Join(plan.Kept, ", "))
	}
	if !yes && len(plan.Remove) > 0 {
		fmt.Fprintln(&buf, "nothing was removed: run again with --yes to remove them")
	}
	_, err = os.Stdout.Write(buf.Bytes())
	return err
}

func branchDiff(c *cli.Context) error {
	format, err := begin(c, func(n int) bool { return n == 2 }, "two branches, A and B")
	if err != nil {
		return err
	}
	d, err := agentOf(c).Branches().Compare(c.Args().Get(0), c.Args().Get(1))
	if err != nil {
		return err
	}
	if format == "json" {
		return printJSON(d)
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "lineage: %s (sources %s, %s)\n", d.Lineage.Relation, d.Lineage.SourceA, d.Lineage.SourceB)
	for _, l := range d.Labels {
		fmt.Fprintf(&buf, "label %s: %q -> %q\n", l.Key, l.A, l.B)
	}
	fmt.Fprintf(&buf, "memory and images: %s -> %s, %s of B shared with A\n", humanBytes(d.Size.A.Files), humanBytes(d.Size.B.Files), humanBytes(d.Size.SharedBytes))
	for _, p := range d.Process.OnlyA {
		fmt.Fprintf(&buf, "process - %d %s\n", p.Pid, p.Comm)
	}
	for _, p := range d.Process.OnlyB {
		fmt.Fprintf(&buf, "process + %d %s\n", p.Pid, p.Comm)
	}
	for _, w := range d.Warnings {
		fmt.Fprintf(&buf, "note: %s\n", w)
	}
	for _, f := range d.Files {
		fmt.Fprintf(&buf, "%s %s\n", f.Kind, f.Path)
	}
	_, err = os.Stdout.Write(buf.Bytes())
	return err
}

func branchExport(c *cli.Context) error {
	setDebug(c)
	if c.IsSet("image") {
		return branchExportImage(c)
	}
	if c.IsSet("parent-image") {
		return fmt.Errorf("--parent-image goes with --image: a delta is a layer over a checkpoint image; see --help")
	}
	if c.NArg() != 2 {
		return fmt.Errorf("podman container branch export takes a branch NAME and a FILE; see --help")
	}
	_, err := agentOf(c).ExportBranchFile(c.Args().Get(0), c.Args().Get(1))
	return err
}

func branchExportImage(c *cli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("podman container branch export --image IMAGE takes one branch NAME; see --help")
	}
	format := c.String("format")
	if format != "" && format != "json" {
		return fmt.Errorf("--format %q: the one format is json", format)
	}
	ctx, stop, err := connectTo(c.Context, hostlayout.Of(c), target{url: c.String("url")}, false)
	if err != nil {
		return err
	}
	defer stop()
	x, err := agentOf(c).ExportBranchImage(ctx, c.Args().First(), c.String("image"), c.String("parent-image"))
	if err != nil {
		return err
	}
	if format == "json" {
		return printJSON(x)
	}
	for _, n := range x.Notes {
		fmt.Fprintf(os.Stderr, "note: %s\n", n)
	}
	if d := x.Delta; d != nil {
		fmt.Fprintf(os.Stderr, "a layer of %s over image %s: %d of %d memory pages and %d files left to it\n",
			humanBytes(x.Bytes), d.ParentImage, d.PagesInParent, d.Pages, d.FilesInParent)
	}
	fmt.Fprintf(os.Stderr, "restore it with: podman container restore %s\n", strings.Join(append(x.RestoreFlags, x.Image), " "))
	_, err = fmt.Println(x.ID)
	return err
}

func branchKey(c *cli.Context) error {
	setDebug(c)
	if c.NArg() != 0 {
		return fmt.Errorf("podman container branch key takes no arguments; see --help")
	}
	key, err := signing.HostKey(hostlayout.Of(c).Keys)
	if err != nil {
		return err
	}
	_, err = fmt.Println(key.Public())
	return err
}

func branchImport(c *cli.Context) error {
	setDebug(c)
	if n := c.NArg(); (c.IsSet("image") && n != 0) || (!c.IsSet("image") && n != 1) {
		return fmt.Errorf("podman container branch import takes one FILE, or --image IMAGE; see --help")
	}
	opts := podmanfork.ImportOptions{Name: c.String("name"), InsecureUnsigned: c.Bool("insecure-unsigned"), SkipTLSVerify: !c.Bool("tls-verify")}
	for _, v := range c.StringSlice("trust") {
		k, err := signing.ParseTrust(v)
		if err != nil {
			return err
		}
		opts.Trust = append(opts.Trust, k)
	}
	ctx, stop, err := connectTo(c.Context, hostlayout.Of(c), target{url: c.String("url")}, false)
	if err != nil {
		return err
	}
	defer stop()
	var b *branch.Branch
	if c.IsSet("image") {
		b, err = agentOf(c).ImportBranchImage(ctx, c.String("image"), opts)
	} else {
		b, err = agentOf(c).ImportBranch(ctx, c.Args().First(), opts)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Println(b.ID)
	return err
}
