package criuhooks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// startedHooks records the PID of the criu process its call started.
type startedHooks struct {
	criu.NoNotify
	pid int
}

func (h *startedHooks) CriuStarted(pid int) { h.pid = pid }

// A CRIU that never answers is killed at the deadline and reaped, and
// OnTimeout runs at that moment (the capture thaws its source there), not
// after the call has unwound. The hooks learn the criu process's PID
// whatever its program is called.
func TestTimeoutKillsCriuAndCallsOnTimeout(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "not-named-criu")
	os.WriteFile(fake, []byte("#!/bin/sh\nwhile :; do sleep 0.05; done\n"), 0o755)
	hooks := &startedHooks{}
	var timedOut time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Dump(ctx, Request{
		CriuPath:  fake,
		Opts:      &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1), ImagesDir: proto.String(t.TempDir())},
		OnTimeout: func() { timedOut = time.Now() },
	}, hooks)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("error %v, want ErrTimeout", err)
	}
	if timedOut.IsZero() {
		t.Fatal("OnTimeout was not called")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the call took %s to unwind after a 300ms deadline", d)
	}
	if hooks.pid == 0 {
		t.Fatal("the hooks were not told the criu process's PID")
	}
	if err := unix.Kill(hooks.pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("criu process %d is still there (%v): not killed, or not reaped", hooks.pid, err)
	}
}

// A criu that exits while a child of its holds its socket (a kernel
// probe's child, stopped, when criu is killed) ends the call: the wait for
// its answer does not outlive it. Without a deadline of its own, the call
// returns within moments, and says criu did not answer.
func TestCriuExitEndsCallWhileChildHoldsSocket(t *testing.T) {
	dir := t.TempDir()
	fake, childFile := filepath.Join(dir, "criu"), filepath.Join(dir, "child")
	os.WriteFile(fake, []byte("#!/bin/sh\nsleep 60 &\necho $! >"+childFile+"\nkill -9 $$\n"), 0o755)
	t.Cleanup(func() {
		if b, err := os.ReadFile(childFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				unix.Kill(pid, unix.SIGKILL)
			}
		}
	})
	done := make(chan error, 1)
	go func() {
		done <- Dump(context.Background(), Request{
			CriuPath: fake,
			Opts:     &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1), ImagesDir: proto.String(dir)},
		}, nil)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "exited without answering") {
			t.Fatalf("error %v, want criu's exit without an answer", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the call still waits for a criu that exited, 20 s on")
	}
	if b, err := os.ReadFile(childFile); err != nil || len(b) == 0 {
		t.Fatalf("the fake criu's child never started (%v): the test proved nothing", err)
	}
}

// The criu process gets Request.Env in its environment, over tclone's
// variables of the same name, and tclone's own environment stays as it was.
func TestEnvIsTheCallsOnly(t *testing.T) {
	dir := t.TempDir()
	fake, seen := filepath.Join(dir, "criu"), filepath.Join(dir, "env")
	os.WriteFile(fake, []byte("#!/bin/sh\nenv >"+seen+"\n"), 0o755)
	t.Setenv("CRIU_FAULT", "1")
	err := Dump(context.Background(), Request{
		CriuPath: fake,
		Env:      []string{"CRIU_FAULT=130", "TCLONE_TEST_ENV=x"},
		Opts:     &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1), ImagesDir: proto.String(dir)},
	}, nil)
	if err == nil {
		t.Fatal("a criu that exits without answering succeeded")
	}
	env, rerr := os.ReadFile(seen)
	if rerr != nil {
		t.Fatal(rerr)
	}
	var got []string
	for _, kv := range strings.Split(string(env), "\n") {
		if strings.HasPrefix(kv, "CRIU_FAULT=") || strings.HasPrefix(kv, "TCLONE_TEST_ENV=") {
			got = append(got, kv)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"CRIU_FAULT=130", "TCLONE_TEST_ENV=x"}) {
		t.Errorf("criu's environment has %q", got)
	}
	if v := os.Getenv("CRIU_FAULT"); v != "1" {
		t.Errorf("tclone's CRIU_FAULT is %q after the call", v)
	}
	if v, ok := os.LookupEnv("TCLONE_TEST_ENV"); ok {
		t.Errorf("tclone's environment has TCLONE_TEST_ENV=%s after the call", v)
	}
}

// A call answers CRIU's notifications through its hooks until CRIU's
// answer; a hook's error ends it, unanswered.
func TestCallRunsHooks(t *testing.T) {
	for _, failing := range []bool{false, true} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		sk, peer := os.NewFile(uintptr(fds[0]), "sk"), os.NewFile(uintptr(fds[1]), "peer")
		// peer plays CRIU: a dump that notifies pre-dump, post-dump and
		// dump-resumed (tclone's build of CRIU).
		served := make(chan []string, 1)
		go func() {
			defer peer.Close()
			var got []string
			buf := make([]byte, 4096)
			send := func(resp *rpc.CriuResp) bool {
				b, _ := proto.Marshal(resp)
				if _, err := peer.Write(b); err != nil {
					return false
				}
				n, err := peer.Read(buf)
				if err != nil || n == 0 {
					return false
				}
				req := &rpc.CriuReq{}
				if proto.Unmarshal(buf[:n], req) != nil {
					return false
				}
				got = append(got, req.GetType().String())
				return true
			}
			n, _ := peer.Read(buf)
			req := &rpc.CriuReq{}
			proto.Unmarshal(buf[:n], req)
			got = append(got, req.GetType().String(), fmt.Sprint(req.GetOpts().GetNotifyScripts()))
			for _, script := range []string{"pre-dump", "post-dump", "dump-resumed"} {
				if !send(&rpc.CriuResp{Type: rpc.CriuReqType_NOTIFY.Enum(), Success: proto.Bool(true), Notify: &rpc.CriuNotify{Script: proto.String(script)}}) {
					served <- append(got, "closed")
					return
				}
			}
			b, _ := proto.Marshal(&rpc.CriuResp{Type: rpc.CriuReqType_DUMP.Enum(), Success: proto.Bool(true)})
			peer.Write(b)
			served <- got
		}()
		hooks := &CaptureHooks{}
		var ran []string
		hooks.OnPostDump = func() error {
			ran = append(ran, "post-dump")
			if failing {
				return errors.New("boom")
			}
			return nil
		}
		s := &swrk{sk: sk}
		_, err = s.call(&rpc.CriuReq{Type: rpc.CriuReqType_DUMP.Enum(), Opts: &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1)}}, namedHooks{hooks})
		sk.Close()
		got := <-served
		want := []string{"DUMP", "true", "NOTIFY", "NOTIFY", "NOTIFY"}
		if failing {
			want = []string{"DUMP", "true", "NOTIFY", "closed"}
			var herr *HookError
			if !errors.As(err, &herr) || herr.Hook != "post-dump" {
				t.Errorf("a failing hook: error %v", err)
			}
		} else if err != nil {
			t.Errorf("call: %v", err)
		}
		if !slices.Equal(got, want) || !slices.Equal(ran, []string{"post-dump"}) || hooks.PostDumpAt.IsZero() || hooks.ResumedAt.IsZero() != failing {
			t.Errorf("failing=%v: CRIU got %q, want %q; hooks ran %q", failing, got, want, ran)
		}
	}
}

// An answer criu sent before it exited is read even when the reader comes
// to it after the deadline its exit set.
func TestAnswerQueuedBeforeExitIsRead(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	s := &swrk{sk: os.NewFile(uintptr(fds[0]), "tclone-end")}
	peer := os.NewFile(uintptr(fds[1]), "criu-end")
	defer s.sk.Close()
	defer peer.Close()
	answer, err := proto.Marshal(&rpc.CriuResp{
		Type: rpc.CriuReqType_VERSION.Enum(), Success: proto.Bool(true),
		Version: &rpc.CriuVersion{MajorNumber: proto.Int32(4), MinorNumber: proto.Int32(2)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write(answer); err != nil {
		t.Fatal(err)
	}
	s.sk.SetReadDeadline(time.Now().Add(-time.Second))
	resp, err := s.call(&rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()}, nil)
	if err != nil {
		t.Fatalf("the queued answer was not read: %v", err)
	}
	if resp.GetVersion().GetMajorNumber() != 4 {
		t.Fatalf("answer %v", resp)
	}
	// With nothing queued, the same late read says criu did not answer.
	if _, err := s.call(&rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()}, nil); err == nil || !strings.Contains(err.Error(), "exited without answering") {
		t.Fatalf("error %v, want criu's exit without an answer", err)
	}
}
