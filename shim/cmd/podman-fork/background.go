package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/shim/forkflags/podmanflags"
)

// `branch create --wait runnable` hands the creation to a process of its
// own, which outlives the command: it is this binary, run as a durable
// create with --notify-fd, in a session of its own. It writes one line to
// that descriptor: "runnable ID" once the source runs on, or "error MSG".
// If the command is gone by then, the creation is rolled back; after it,
// a failure leaves the branch listed as failed.
const notifyFlag = "notify-fd"

func createInBackground(c *cli.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{BranchCommand}
	if u := c.String("url"); u != "" {
		args = append(args, "--url="+u)
	}
	args = append(args, "create", "--wait=durable", fmt.Sprintf("--%s=3", notifyFlag))
	// The writer gets every flag of the branch that was given, from the
	// table both read.
	for _, f := range podmanflags.BranchCreate() {
		name := f.Names()[0]
		if !c.IsSet(name) {
			continue
		}
		switch f.(type) {
		case *cli.StringSliceFlag:
			for _, v := range c.StringSlice(name) {
				args = append(args, "--"+name+"="+v)
			}
		case *cli.BoolFlag:
			args = append(args, fmt.Sprintf("--%s=%t", name, c.Bool(name)))
		default:
			args = append(args, "--"+name+"="+c.String(name))
		}
	}
	args = append(args, "--", c.Args().Get(0), c.Args().Get(1))
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := &exec.Cmd{Path: exe, Args: args, ExtraFiles: []*os.File{w}, Dir: "/",
		SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("starting the branch writer: %w", err)
	}
	w.Close()
	// ^C or TERM before the branch is runnable ends the writer, which
	// rolls back.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-c.Context.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case <-stop:
		}
	}()
	line, _ := bufio.NewReader(r).ReadString('\n')
	word, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch word {
	case "runnable":
		cmd.Process.Release()
		_, err := fmt.Println(rest)
		return err
	case "error":
		cmd.Wait()
		return errors.New(rest)
	}
	werr := cmd.Wait()
	if c.Context.Err() != nil {
		return fmt.Errorf("branch %s cancelled; everything it made was removed", c.Args().Get(1))
	}
	return fmt.Errorf("the branch writer ended (%v) before the branch was runnable; run tclone gc", werr)
}

// notice tells the command that started this writer how it went; the zero
// value (no --notify-fd) tells no one.
type notice struct{ f *os.File }

func notifier(c *cli.Context) (*notice, error) {
	if !c.IsSet(notifyFlag) {
		return &notice{}, nil
	}
	f := os.NewFile(uintptr(c.Int(notifyFlag)), "notify")
	if f == nil {
		return nil, fmt.Errorf("--%s %d is not an open descriptor", notifyFlag, c.Int(notifyFlag))
	}
	return &notice{f: f}, nil
}

// runnable is podmanfork.BranchOptions.Runnable.
func (n *notice) runnable(b *branch.Branch) error {
	if n.f == nil {
		return nil
	}
	_, err := fmt.Fprintf(n.f, "runnable %s\n", b.ID)
	n.f.Close()
	n.f = nil
	if err != nil {
		return fmt.Errorf("the command that asked for branch %s is gone (%v): not writing it", b.Name, err)
	}
	return nil
}

// failed reports a failure before the branch was runnable.
func (n *notice) failed(err error) {
	if n.f != nil {
		fmt.Fprintf(n.f, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		n.f.Close()
		n.f = nil
	}
}
