// Command oldcriu answers as a CRIU too old for tclone would: its RPC
// (`oldcriu swrk FD`) says version 4.1.1 to a version request and fails
// every other request. The
// preflight test points TCLONE_CRIU at it, to see tclone refuse it before
// anything touches a container.
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] != "swrk" {
		fmt.Fprintln(os.Stderr, "oldcriu: takes swrk FD")
		os.Exit(1)
	}
	fd, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "oldcriu:", err)
		os.Exit(1)
	}
	sk := os.NewFile(uintptr(fd), "swrk")
	buf := make([]byte, 64<<10)
	for {
		n, err := sk.Read(buf)
		if err != nil || n == 0 {
			return
		}
		req := &rpc.CriuReq{}
		if err := proto.Unmarshal(buf[:n], req); err != nil {
			fmt.Fprintln(os.Stderr, "oldcriu:", err)
			os.Exit(1)
		}
		resp := &rpc.CriuResp{Type: req.Type, Success: proto.Bool(false), CrErrmsg: proto.String("oldcriu answers version requests only")}
		if req.GetType() == rpc.CriuReqType_VERSION {
			resp.Success, resp.CrErrmsg = proto.Bool(true), nil
			resp.Version = &rpc.CriuVersion{MajorNumber: proto.Int32(4), MinorNumber: proto.Int32(1), Sublevel: proto.Int32(1)}
		}
		out, err := proto.Marshal(resp)
		if err != nil {
			os.Exit(1)
		}
		if _, err := sk.Write(out); err != nil {
			return
		}
	}
}
