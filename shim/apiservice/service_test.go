package apiservice

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/errorhandling"

	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// fakePodman answers like Podman's service: a ping, a list, an event
// stream, and an exec start that takes the connection over and echoes its
// input in capitals.
func fakePodman(t *testing.T, socket string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Libpod-API-Version", "5.4.2")
		switch {
		case strings.HasSuffix(r.URL.Path, "/_ping"):
			io.WriteString(w, "OK")
		case strings.HasSuffix(r.URL.Path, "/containers/json"):
			w.Header().Set("X-Podman", "yes")
			io.WriteString(w, `[{"Id":"abc"}]`)
		case strings.HasSuffix(r.URL.Path, "/events"):
			io.WriteString(w, `{"Status":"start"}`+"\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case strings.HasSuffix(r.URL.Path, "/start"):
			body, _ := io.ReadAll(r.Body)
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\nbody=%s;", body)
			in, _ := io.ReadAll(buf)
			conn.Write([]byte(strings.ToUpper(string(in))))
		default:
			http.NotFound(w, r)
		}
	})
	serveOn(t, socket, mux)
}

func serveOn(t *testing.T, socket string, h http.Handler) {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// stack serves a Service in front of a fake Podman; it returns the service
// and its socket.
func stack(t *testing.T, podmanUp bool) (*Service, string) {
	dir := t.TempDir()
	podman := filepath.Join(dir, "podman.sock")
	if podmanUp {
		fakePodman(t, podman)
	}
	s := New(hostagent.New(plan.LayoutUnder(t.TempDir())), podman, "test-version")
	socket := filepath.Join(dir, "tclone.sock")
	serveOn(t, socket, s)
	return s, socket
}

func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func TestProxyPassesRequestsThrough(t *testing.T) {
	_, socket := stack(t, true)
	resp, err := unixClient(socket).Get("http://d/v5.4.2/libpod/containers/json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `[{"Id":"abc"}]` || resp.Header.Get("X-Podman") != "yes" ||
		resp.Header.Get(podmanfork.ServiceHeader) != "test-version" {
		t.Errorf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// A stream reaches the client as it is written, not when it ends.
func TestProxyStreams(t *testing.T) {
	_, socket := stack(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://d/v5.4.2/libpod/events", nil)
	resp, err := unixClient(socket).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "start") {
		t.Errorf("first event: %q, %v", line, err)
	}
}

// An exec start's connection is Podman's: input the client sends after the
// request (and its end) reach Podman, and Podman's output the client.
func TestExecStartConnectionIsJoined(t *testing.T) {
	_, socket := stack(t, true)
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"Detach":false}`
	fmt.Fprintf(conn, "POST /v5.4.2/libpod/exec/e1/start HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%shello stdin", len(body), body)
	conn.(*net.UnixConn).CloseWrite()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	out, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "HTTP/1.1 200 OK") || !strings.HasSuffix(string(out), "body="+body+";HELLO STDIN") {
		t.Errorf("got %q", out)
	}
}

func TestPodmanDownIs503(t *testing.T) {
	_, socket := stack(t, false)
	resp, err := unixClient(socket).Get("http://d/v5.4.2/libpod/containers/json")
	if err != nil {
		t.Fatal(err)
	}
	var e errorhandling.ErrorModel
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 503 || e.ResponseCode != 503 || !strings.Contains(e.Message, "podman-service.sh start") {
		t.Errorf("got %d %+v", resp.StatusCode, e)
	}
}

func post(t *testing.T, socket, path string) (int, errorhandling.ErrorModel) {
	t.Helper()
	resp, err := unixClient(socket).Post("http://d"+path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e errorhandling.ErrorModel
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e
}

// Each kind of failure gets Podman's status and error body.
func TestForkStatuses(t *testing.T) {
	s, socket := stack(t, true)
	var calls atomic.Int32
	s.fork = func(_ context.Context, source string, _ podmanfork.Options) (*podmanfork.Stats, error) {
		calls.Add(1)
		switch source {
		case "missing":
			return nil, fmt.Errorf("cannot fork missing: %w", errors.Join(podmanfork.ErrNoSuchSource, errors.New("no such container")))
		case "paused":
			return nil, fmt.Errorf("cannot fork paused: %w", podmanfork.ErrConflict)
		case "broken":
			return nil, errors.New("criu dump failed")
		}
		return &podmanfork.Stats{Source: source}, nil
	}
	for _, c := range []struct {
		path   string
		status int
		want   string
	}{
		{"/v5.4.2/libpod/containers/missing/fork", 404, "cannot fork missing"},
		{"/v5.4.2/libpod/containers/paused/fork", 409, "cannot fork paused"},
		{"/v5.4.2/libpod/containers/broken/fork", 500, "criu dump failed"},
		{"/v5.4.2/libpod/containers/ok/fork?count=0", 400, "--count 0"},
		{"/v5.4.2/libpod/containers/ok/fork?count=2&publish=8080:80", 400, "host port"},
		{"/v5.4.2/libpod/containers/ok/fork?speed=fast", 400, "unknown query parameter"},
		{"/libpod/containers/ok/fork", 200, ""},
	} {
		status, e := post(t, socket, c.path)
		if status != c.status || (c.want != "" && (e.ResponseCode != c.status || !strings.Contains(e.Message, c.want))) {
			t.Errorf("%s: %d %+v, want %d saying %q", c.path, status, e, c.status, c.want)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("the fork ran %d times, want 4 (never for a bad parameter)", n)
	}
	resp, err := unixClient(socket).Get("http://d/v5.4.2/libpod/containers/ok/fork")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET of the fork endpoint: %d, want 405", resp.StatusCode)
	}
}

// A client that goes away cancels its fork (which then rolls back).
func TestForkCancelledWhenClientLeaves(t *testing.T) {
	s, socket := stack(t, true)
	started, ended := make(chan struct{}), make(chan error, 1)
	s.fork = func(ctx context.Context, _ string, _ podmanfork.Options) (*podmanfork.Stats, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://d/v5.4.2/libpod/containers/src/fork", nil)
	if _, err := unixClient(socket).Do(req); err == nil {
		t.Fatal("the request was not cut")
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("fork ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fork was not cancelled when its client left")
	}
}

// Shutdown waits for a fork under way; past its deadline it cancels it.
// A fork asked for meanwhile is refused with 503.
func TestShutdownWaitsThenCancelsForks(t *testing.T) {
	s, socket := stack(t, true)
	started := make(chan struct{})
	var cause atomic.Value
	s.fork = func(ctx context.Context, _ string, _ podmanfork.Options) (*podmanfork.Stats, error) {
		close(started)
		<-ctx.Done()
		cause.Store(context.Cause(ctx).Error())
		return nil, ctx.Err()
	}
	go func() {
		// The answer is not awaited: the fork's end is what is checked.
		if resp, err := unixClient(socket).Post("http://d/v5.4.2/libpod/containers/src/fork", "", nil); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	s.Shutdown(ctx)
	if d := time.Since(t0); d < 250*time.Millisecond {
		t.Errorf("Shutdown returned after %s, before its deadline, with a fork under way", d)
	}
	if c, _ := cause.Load().(string); !strings.Contains(c, "stopping") {
		t.Errorf("the fork ended with cause %q, want the shutdown", c)
	}
	if status, e := post(t, socket, "/v5.4.2/libpod/containers/src/fork"); status != 503 || !strings.Contains(e.Message, "stopping") {
		t.Errorf("a fork during shutdown: %d %+v", status, e)
	}
}

// The Go client forks through the service, with every option intact, and
// gets the fork's error kinds back.
func TestGoClientThroughService(t *testing.T) {
	s, socket := stack(t, true)
	var got podmanfork.Options
	s.fork = func(_ context.Context, source string, opts podmanfork.Options) (*podmanfork.Stats, error) {
		if source == "busy" {
			return nil, fmt.Errorf("sibling 1 of 1 (x): %w", podmanfork.ErrConflict)
		}
		got = opts
		return &podmanfork.Stats{Source: source, Call: "n1", Siblings: []*podmanfork.Result{{ID: "id1", Name: "x"}}}, nil
	}
	conn, err := bindings.NewConnection(context.Background(), "unix://"+socket)
	if err != nil {
		t.Fatal(err)
	}
	opts := podmanfork.Options{Names: []string{"x"}, Hooks: []string{"echo a, b"}, Labels: map[string]string{"k": "v"}}
	st, err := podmanfork.ForkWithStats(conn, "src", opts)
	if err != nil {
		t.Fatal(err)
	}
	if st.Source != "src" || len(st.Siblings) != 1 || st.Siblings[0].ID != "id1" {
		t.Errorf("stats: %+v", st)
	}
	if len(got.Hooks) != 1 || got.Hooks[0] != "echo a, b" || got.Labels["k"] != "v" || got.Names[0] != "x" {
		t.Errorf("the service got %+v", got)
	}
	_, err = podmanfork.ForkWithStats(conn, "busy", opts)
	if !errors.Is(err, podmanfork.ErrConflict) || !strings.Contains(err.Error(), "sibling 1 of 1") {
		t.Errorf("a conflict came back as %v", err)
	}
	if _, err = podmanfork.ForkWithStats(conn, "src", podmanfork.Options{Count: 99}); !errors.Is(err, podmanfork.ErrInvalidOption) {
		t.Errorf("a bad count came back as %v", err)
	}
}

// A fork with Podman's service down is 503 too, saying how to start it.
func TestForkWithPodmanDownIs503(t *testing.T) {
	_, socket := stack(t, false)
	status, e := post(t, socket, "/v5.4.2/libpod/containers/src/fork")
	if status != 503 || !strings.Contains(e.Message, "podman-service.sh start") {
		t.Errorf("got %d %+v", status, e)
	}
}
