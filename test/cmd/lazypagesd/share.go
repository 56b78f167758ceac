package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/tclone/tclone/criuhooks/lazypages"
)

// serveControl answers "share PID" lines at path with "ok" or "error: ...".
func serveControl(d *lazypages.Daemon, path string) error {
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				f := strings.Fields(line)
				pid := 0
				if len(f) == 2 && f[0] == "share" {
					pid, _ = strconv.Atoi(f[1])
				}
				if pid <= 0 {
					fmt.Fprintf(c, "error: want \"share PID\", got %q\n", strings.TrimSpace(line))
					return
				}
				if _, err := d.Share(pid); err != nil {
					fmt.Fprintf(c, "error: %v\n", err)
					return
				}
				fmt.Fprintln(c, "ok")
			}()
		}
	}()
	return nil
}

// hookShare is CRIU's action script: at pre-resume it asks the daemon to
// share with the restored tree, whose root CRIU names in CRTOOLS_INIT_PID.
func hookShare(control string) int {
	if os.Getenv("CRTOOLS_SCRIPT_ACTION") != "pre-resume" {
		return 0
	}
	c, err := net.Dial("unix", control)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lazypagesd: share: %v\n", err)
		return 1
	}
	defer c.Close()
	fmt.Fprintf(c, "share %s\n", os.Getenv("CRTOOLS_INIT_PID"))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ok" {
		fmt.Fprintf(os.Stderr, "lazypagesd: share: %q %v\n", strings.TrimSpace(line), err)
		return 1
	}
	return 0
}
