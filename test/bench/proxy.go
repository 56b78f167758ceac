package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ProxyResult is what tclone's API service (`tclone service`) adds to
// ordinary requests: each request is sent in turn to Podman's socket and to
// tclone's in front of it, alternating which goes first, and the added
// latency is the median of the paired differences.
type ProxyResult struct {
	Reps     int             `json:"reps"`
	Requests []*ProxyRequest `json:"requests"`
}

// ProxyRequest is one kind of request, in milliseconds.
type ProxyRequest struct {
	Name    string  `json:"name"`
	Podman  Stat    `json:"podman"`
	Tclone  Stat    `json:"tclone"`
	AddedMs float64 `json:"added_ms"`
}

// proxyRequests are measured in this order.
var proxyRequests = []string{"GET /libpod/containers/json", "exec true (create, start, read to the end)"}

// apiVersion is the path prefix of the libpod API the requests use.
const apiVersion = "/v5.4.2/libpod"

func (b *Bench) runProxy(ctx context.Context) *ProxyResult {
	pr := &ProxyResult{Reps: b.cfg.ProxyReps}
	podmanSock := strings.TrimPrefix(b.svc.url, "unix://")
	dir, err := os.MkdirTemp("", "tcb-bench-api-")
	if err != nil {
		b.fail("rest-proxy", "tclone service", -1, err)
		return pr
	}
	defer os.RemoveAll(dir)
	tcloneSock := filepath.Join(dir, "tclone.sock")
	svc := exec.Command(b.tools.Tclone, "service", "--url", "unix://"+tcloneSock, "--podman-url", b.svc.url)
	svc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := svc.Start(); err != nil {
		b.fail("rest-proxy", "tclone service", -1, err)
		return pr
	}
	b.trackCmd(svc)
	defer func() {
		svc.Process.Signal(syscall.SIGTERM)
		svc.Wait()
	}()
	ctr := fmt.Sprintf("tcb-%s-api", b.runID)
	b.track(ctr)
	defer b.removeContainers(ctr)
	if _, _, err := b.tools.podman(ctx, "run", "-d", "--name", ctr, "--label", "io.tclone.bench="+b.runID, busyboxImage, "sleep", "3600"); err != nil {
		b.fail("rest-proxy", "podman run", -1, err)
		return pr
	}
	clients := []*http.Client{unixHTTP(podmanSock), unixHTTP(tcloneSock)}
	if err := waitAnswer(ctx, clients[1]); err != nil {
		b.fail("rest-proxy", "tclone service", -1, err)
		return pr
	}
	calls := []func(*http.Client) error{
		func(c *http.Client) error { return apiCall(c, http.MethodGet, "/containers/json", nil, nil) },
		func(c *http.Client) error { return execTrue(c, ctr) },
	}
	for i, call := range calls {
		reps := b.cfg.ProxyReps
		if i == 1 {
			reps = max(3, reps/4) // an exec costs tens of milliseconds
		}
		req, err := measurePaired(ctx, clients, call, reps)
		if err != nil {
			b.fail("rest-proxy", proxyRequests[i], -1, err)
			continue
		}
		req.Name = proxyRequests[i]
		pr.Requests = append(pr.Requests, req)
	}
	return pr
}

// measurePaired runs call through each client in turn, reps times after a
// few unmeasured warm-ups, alternating which goes first.
func measurePaired(ctx context.Context, clients []*http.Client, call func(*http.Client) error, reps int) (*ProxyRequest, error) {
	for range 3 {
		for _, c := range clients {
			if err := call(c); err != nil {
				return nil, err
			}
		}
	}
	times := [2][]float64{}
	var diffs []float64
	for i := range reps {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var t [2]float64
		for k := range 2 {
			which := (i + k) % 2
			start := time.Now()
			if err := call(clients[which]); err != nil {
				return nil, err
			}
			t[which] = float64(time.Since(start).Microseconds()) / 1000
		}
		times[0], times[1] = append(times[0], t[0]), append(times[1], t[1])
		diffs = append(diffs, t[1]-t[0])
	}
	slices.Sort(diffs)
	return &ProxyRequest{Podman: summarize(times[0]), Tclone: summarize(times[1]), AddedMs: diffs[len(diffs)/2]}, nil
}

func unixHTTP(socket string) *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func waitAnswer(ctx context.Context, c *http.Client) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := apiCall(c, http.MethodGet, "/_ping", nil, nil)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apiCall sends a request and reads the whole answer into out (when not
// nil), failing on a status other than 2xx.
func apiCall(c *http.Client, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, "http://d"+apiVersion+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, tail(string(data), 300))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// execTrue runs `true` in ctr as podman exec does: create the session,
// start it attached, read its output to the end.
func execTrue(c *http.Client, ctr string) error {
	var created struct{ Id string }
	if err := apiCall(c, http.MethodPost, "/containers/"+ctr+"/exec",
		map[string]any{"Cmd": []string{"true"}, "AttachStdout": true, "AttachStderr": true}, &created); err != nil {
		return err
	}
	return apiCall(c, http.MethodPost, "/exec/"+created.Id+"/start", map[string]any{"Detach": false, "Tty": false}, nil)
}
