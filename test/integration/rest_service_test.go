package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/podmanfork"
)

// apiService is a `tclone service` this test started.
type apiService struct {
	socket string
	cmd    *exec.Cmd
	log    *strings.Builder
	done   chan error
}

// startAPIService starts tclone's API service on a socket of its own, in
// front of the Podman service the integration run uses; it is stopped (with
// TERM, and must exit 0) when the test ends. extra are more flags.
func startAPIService(t *testing.T, extra ...string) *apiService {
	t.Helper()
	return startAPIServiceIn(t, publicTempDir(t, "tct-api-"), extra...)
}

// startAPIServiceIn is startAPIService with the socket in dir.
func startAPIServiceIn(t *testing.T, dir string, extra ...string) *apiService {
	t.Helper()
	s := &apiService{socket: filepath.Join(dir, "tclone.sock"), log: &strings.Builder{}, done: make(chan error, 1)}
	s.cmd = exec.Command(tcloneBin(), append([]string{"service", "--url", "unix://" + s.socket}, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() { s.stop(t) })
	waitListening(t, "unix", s.socket)
	return s
}

// waitListening waits until something accepts connections at addr.
func waitListening(t *testing.T, network, addr string) {
	t.Helper()
	eventually(t, 10*time.Second, network+" "+addr+" listening", func() error {
		c, err := net.Dial(network, addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// publicTempDir is a directory that users other than root may enter,
// removed when the test ends.
func publicTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", prefix)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// stop sends TERM and fails the test unless the service exits 0.
func (s *apiService) stop(t *testing.T) {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("tclone service exited with %v:\n%s", err, s.log)
		}
	case <-time.After(3 * time.Minute):
		s.cmd.Process.Kill()
		<-s.done
		t.Errorf("tclone service did not stop on TERM:\n%s", s.log)
	}
}

// curl runs curl against the service and returns the status and body.
func (s *apiService) curl(t *testing.T, method, path string) (int, string) {
	t.Helper()
	r := run(t, 5*time.Minute, "curl", "-sS", "--unix-socket", s.socket, "-X", method, "-w", "\n%{http_code}", "http://d"+path)
	if r.code != 0 {
		t.Fatalf("curl %s %s: exit %d: %s", method, path, r.code, r.stderr)
	}
	body, code, _ := strings.Cut(strings.TrimSpace(r.stdout), "\n")
	if i := strings.LastIndex(r.stdout, "\n"); i >= 0 {
		body, code = strings.TrimSpace(r.stdout[:i]), strings.TrimSpace(r.stdout[i+1:])
	}
	var status int
	fmt.Sscan(code, &status)
	return status, body
}

// errorBody reads Podman's error body.
func errorBody(t *testing.T, body string) (message string, response int) {
	t.Helper()
	var e struct {
		Cause    string `json:"cause"`
		Message  string `json:"message"`
		Response int    `json:"response"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Message == "" {
		t.Fatalf("not Podman's error body: %q (%v)", body, err)
	}
	return e.Message, e.Response
}

const apiVersion = "/v5.4.2"

func forkPath(src string, q url.Values) string {
	p := apiVersion + "/libpod/containers/" + src + "/fork"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return p
}

// A fork from curl, and each refusal with Podman's status and error body,
// leaving nothing behind.
func TestRESTForkWithCurl(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	status, body := svc.curl(t, "POST", forkPath(src, url.Values{"count": {"2"}, "label": {"task=42"}, "readyTimeout": {"30s"}}))
	if status != 200 {
		t.Fatalf("fork: %d %s", status, body)
	}
	var st podmanfork.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("fork answer %q: %v", body, err)
	}
	if len(st.Siblings) != 2 || st.SourcePauseMs <= 0 || st.Source != containerID(t, src) {
		t.Fatalf("fork answer: %s", body)
	}
	for _, s := range st.Siblings {
		if got := state(t, s.Name); got != "running" {
			t.Errorf("%s is %s", s.Name, got)
		}
		if got := podman(t, "inspect", "--format", `{{index .Config.Labels "task"}}`, s.Name); got != "42" {
			t.Errorf("%s: label task=%q", s.Name, got)
		}
		if c := shellCount(t, s.Name); c == 0 {
			t.Errorf("%s: no counter", s.Name)
		}
	}

	// Every refusal leaves the two siblings alone and adds none.
	hostPort := freePort(t)
	ln, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", hostPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	paused := shellSource(t)
	podman(t, "pause", paused)
	defer podmanTry(t, "unpause", paused)
	for _, c := range []struct {
		path   string
		status int
		want   string
	}{
		{forkPath("tct-no-such-container", nil), 404, "no such container"},
		{forkPath(paused, nil), 409, "paused"},
		{forkPath(src, url.Values{"count": {"0"}}), 400, "--count 0"},
		{forkPath(src, url.Values{"count": {"lots"}}), 400, "count"},
		{forkPath(src, url.Values{"memory": {"fast"}}), 400, "memory"},
		{forkPath(src, url.Values{"publish": {fmt.Sprintf("%d:80", hostPort)}}), 409, "port"},
		{forkPath(src, url.Values{"name": {st.Siblings[0].Name}}), 409, "in use"},
	} {
		status, body := svc.curl(t, "POST", c.path)
		msg, resp := errorBody(t, body)
		if status != c.status || resp != c.status || !strings.Contains(strings.ToLower(msg), c.want) {
			t.Errorf("POST %s: %d %s, want %d saying %q", c.path, status, body, c.status, c.want)
		}
	}
	if got := siblingsOf(t, src); len(got) != 2 {
		t.Errorf("siblings after the refusals: %v, want the 2 from before", got)
	}
	if got := state(t, src); got != "running" {
		t.Errorf("source is %s", got)
	}
	requireNoLiveCalls(t)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Podman's own clients work through the service unchanged: podman --url
// (ps, exec with its attached streams, logs, inspect) and the Go bindings.
func TestRESTProxyServesPodmanClients(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	remote := func(args ...string) result {
		return run(t, 2*time.Minute, "/usr/bin/podman", append([]string{"--url", "unix://" + svc.socket}, args...)...)
	}
	if r := remote("ps", "--format", "{{.Names}}"); r.code != 0 || !strings.Contains(r.stdout, src) {
		t.Errorf("podman --url ps: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := remote("exec", src, "/bin/sh", "-c", "echo out; echo err >&2; exit 3"); r.code != 3 || strings.TrimSpace(r.stdout) != "out" || !strings.Contains(r.stderr, "err") {
		t.Errorf("podman --url exec: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Input reaches the command, and its end ends it.
	cmd := exec.Command("/usr/bin/podman", "--url", "unix://"+svc.socket, "exec", "-i", src, "/bin/sh", "-c", "read a; read b; echo \"$b $a\"")
	cmd.Stdin = strings.NewReader("one\ntwo\n")
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "two one" {
		t.Errorf("podman --url exec -i: %q %v", out, err)
	}
	if r := remote("inspect", "--format", "{{.State.Status}}", src); strings.TrimSpace(r.stdout) != "running" {
		t.Errorf("podman --url inspect: %q %q", r.stdout, r.stderr)
	}
	// A fork through podman container fork --url: the service forks.
	r := forkCLI(t, "--url", "unix://"+svc.socket, "--format", "json", src)
	if r.code != 0 {
		t.Fatalf("podman container fork --url: %s", r.stderr)
	}
	var sibs []podmanfork.Result
	if err := json.Unmarshal([]byte(r.stdout), &sibs); err != nil || len(sibs) != 1 {
		t.Fatalf("fork output %q: %v", r.stdout, err)
	}
	if !strings.Contains(svc.log.String(), "fork of "+src+" for ") {
		t.Errorf("the fork did not go through the service; its log:\n%s", svc.log)
	}
}

// Eight clients fork one source at once: each gets its own sibling.
func TestRESTConcurrentForks(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	const n = 8
	var wg sync.WaitGroup
	results := make([]*podmanfork.Stats, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each client has a connection of its own.
			conn, err := bindings.NewConnection(context.Background(), "unix://"+svc.socket)
			if err == nil {
				results[i], err = podmanfork.ForkWithStats(conn, src, podmanfork.Options{ReadyTimeout: 2 * time.Minute})
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	var names []string
	for i := range n {
		if errs[i] != nil {
			t.Errorf("client %d: %v", i, errs[i])
			continue
		}
		names = append(names, results[i].Siblings[0].Name)
	}
	slices.Sort(names)
	if len(slices.Compact(names)) != n {
		t.Errorf("sibling names %v: want %d distinct", names, n)
	}
	if got := siblingsOf(t, src); len(got) != n {
		t.Errorf("%d siblings, want %d", len(got), n)
	}
	for _, s := range names {
		if got := state(t, s); got != "running" {
			t.Errorf("%s is %s", s, got)
		}
	}
	if got := state(t, src); got != "running" {
		t.Errorf("source is %s", got)
	}
	requireNoLiveCalls(t)
}

// A client that disconnects in the middle of its fork: the fork is rolled
// back, nothing is left, and the service goes on serving.
func TestRESTClientDisconnectsMidFork(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := url.Values{"count": {"2"}, "hook": {"sleep 30"}, "readyTimeout": {"2m"}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://d"+forkPath(src, q), nil)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", svc.socket)
	}}}
	answered := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			err = fmt.Errorf("answered %d %s", resp.StatusCode, b)
		}
		answered <- err
	}()
	// The client leaves once a sibling exists, its hook running.
	eventually(t, 2*time.Minute, "a sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	cancel()
	if err := <-answered; !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("the request was not cut: %v", err)
	}
	requireRolledBack(t, src, nil)
	if status, body := svc.curl(t, "POST", forkPath(src, nil)); status != 200 {
		t.Errorf("a fork after the disconnect: %d %s", status, body)
	}
}

// requireRolledBack waits until src has no sibling and no live fork call
// record is left (running first, each time, when not nil), then fails on
// any other leftover or a source that no longer runs.
func requireRolledBack(t *testing.T, src string, first func() error) {
	t.Helper()
	eventually(t, 90*time.Second, "the fork rolled back", func() error {
		if first != nil {
			if err := first(); err != nil {
				return err
			}
		}
		if got := siblingsOf(t, src); len(got) > 0 {
			return fmt.Errorf("siblings left: %v", got)
		}
		if l := liveCalls(t); len(l) > 0 {
			return fmt.Errorf("call records left: %v", l)
		}
		return nil
	})
	requireNoLeftovers(t)
	if got := state(t, src); got != "running" {
		t.Errorf("source is %s", got)
	}
}

// TERM while a fork is under way: the fork finishes and is answered, then
// the service exits 0; it takes no fork meanwhile.
func TestRESTServiceStopsAfterForksUnderWay(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	answered := make(chan [2]any, 1)
	go func() {
		r := run(t, 5*time.Minute, "curl", "-sS", "--unix-socket", svc.socket, "-X", "POST", "-w", "\n%{http_code}",
			"http://d"+forkPath(src, url.Values{"hook": {"sleep 4"}}))
		answered <- [2]any{r.stdout, r.stderr}
	}()
	eventually(t, 2*time.Minute, "a sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	svc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-svc.done:
		if err != nil {
			t.Errorf("service exit: %v\n%s", err, svc.log)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("service did not exit after TERM:\n%s", svc.log)
	}
	a := <-answered
	if out := a[0].(string); !strings.HasSuffix(strings.TrimSpace(out), "200") {
		t.Fatalf("the fork under way was not finished: %q %q\n%s", out, a[1], svc.log)
	}
	if got := siblingsOf(t, src); len(got) != 1 || state(t, got[0]) != "running" {
		t.Errorf("siblings after the stop: %v", got)
	}
	if _, err := os.Stat(svc.socket); err == nil {
		t.Errorf("the socket %s is left", svc.socket)
	}
	requireNoLiveCalls(t)
}

// With Podman's service not running, the service says how to start it.
func TestRESTPodmanNotRunning(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t, "--podman-url", "unix:///run/tct-no-podman/podman.sock")
	for _, p := range []string{apiVersion + "/libpod/containers/json", forkPath("x", nil)} {
		status, body := svc.curl(t, http.MethodGet, p)
		if p != forkPath("x", nil) {
			msg, _ := errorBody(t, body)
			if status != 503 || !strings.Contains(msg, "podman-service.sh start") {
				t.Errorf("GET %s: %d %s", p, status, body)
			}
		}
	}
	status, body := svc.curl(t, http.MethodPost, forkPath("x", nil))
	if msg, _ := errorBody(t, body); status != 503 || !strings.Contains(msg, "podman-service.sh start") {
		t.Errorf("fork without Podman: %d %s", status, body)
	}
}

// pyclientImage holds Debian's python3-podman (hack/build-images.sh).
const pyclientImage = "localhost/tclone-pyclient:latest"

// podman-py against the service: its ordinary calls (ping, version, list,
// get, exec) through the proxy, and a fork and an unknown source through its
// raw API client.
func TestRESTFromPython(t *testing.T) {
	requireStack(t)
	if podmanTry(t, "image", "exists", pyclientImage).code != 0 {
		t.Fatalf("%s is missing: hack/build-images.sh builds it", pyclientImage)
	}
	svc := startAPIService(t)
	src := shellSource(t)
	script, err := filepath.Abs("testdata/pyclient.py")
	if err != nil {
		t.Fatal(err)
	}
	client := name(t, "py")
	r := podmanTry(t, "run", "--rm", "--name", client, "--runtime", "crun",
		"-v", filepath.Dir(svc.socket)+":/run/tclone-api", "-v", script+":/pyclient.py:ro",
		pyclientImage, "python3", "/pyclient.py", "/run/tclone-api/tclone.sock", src)
	if r.code != 0 {
		t.Fatalf("podman-py client: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var out struct {
		Ping          bool     `json:"ping"`
		Version       string   `json:"version"`
		Names         []string `json:"names"`
		Status        string   `json:"status"`
		Exec          []any    `json:"exec"`
		ForkStatus    int      `json:"fork_status"`
		Fork          podmanfork.Stats
		MissingStatus int `json:"missing_status"`
		Missing       struct {
			Message string `json:"message"`
		}
		Siblings []struct {
			Name   string            `json:"name"`
			Status string            `json:"status"`
			Labels map[string]string `json:"labels"`
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("client output %q: %v", r.stdout, err)
	}
	t.Logf("podman-py saw: %s", r.stdout)
	if !out.Ping || out.Version == "" || !slices.Contains(out.Names, src) || out.Status != "running" {
		t.Errorf("ordinary calls: %+v", out)
	}
	if len(out.Exec) != 2 || out.Exec[0] != float64(0) || out.Exec[1] != "exec-ok" {
		t.Errorf("exec through the proxy: %v", out.Exec)
	}
	if out.ForkStatus != 200 || len(out.Fork.Siblings) != 2 || len(out.Siblings) != 2 {
		t.Fatalf("fork: %d, %+v", out.ForkStatus, out.Fork)
	}
	for _, s := range out.Siblings {
		if s.Status != "running" || s.Labels["via"] != "python" || s.Labels[podmanfork.LabelForkedFrom] != containerID(t, src) {
			t.Errorf("sibling %+v", s)
		}
	}
	if out.MissingStatus != 404 || !strings.Contains(out.Missing.Message, "no such container") {
		t.Errorf("unknown source: %d %q", out.MissingStatus, out.Missing.Message)
	}
}

// sshd is an sshd of the test's own on a loopback port, letting one user in
// with one key, which it forwards to unix sockets for (as ssh:// clients of
// Podman need).
type sshd struct {
	port           int
	key, knownHome string
}

func startSSHD(t *testing.T, user string) *sshd {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		t.Fatalf("no sshd: hack/setup-host.sh installs openssh-server: %v", err)
	}
	// Readable by the user sshd reads authorized_keys as; t.TempDir is
	// below a directory only root may enter.
	dir := publicTempDir(t, "tct-ssh-")
	for _, k := range []string{"host", "client"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	clientPub, _ := os.ReadFile(filepath.Join(dir, "client.pub"))
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), clientPub, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &sshd{port: freePort(t), key: filepath.Join(dir, "client"), knownHome: filepath.Join(dir, "home")}
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s/host
AuthorizedKeysFile %s/authorized_keys
PidFile none
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowUsers %s
AllowStreamLocalForwarding yes
`, s.port, dir, dir, user)
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// sshd's privilege separation directory, made by its init script.
	if _, err := os.Stat("/run/sshd"); err != nil {
		os.Mkdir("/run/sshd", 0o755)
		t.Cleanup(func() { os.Remove("/run/sshd") })
	}
	log := &strings.Builder{}
	cmd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd's log:\n%s", log)
		}
	})
	// The client checks the server's key against HOME/.ssh/known_hosts.
	hostPub, _ := os.ReadFile(filepath.Join(dir, "host.pub"))
	os.MkdirAll(filepath.Join(s.knownHome, ".ssh"), 0o700)
	known := fmt.Sprintf("[127.0.0.1]:%d %s", s.port, hostPub)
	if err := os.WriteFile(filepath.Join(s.knownHome, ".ssh", "known_hosts"), []byte(known), 0o600); err != nil {
		t.Fatal(err)
	}
	waitListening(t, "tcp", fmt.Sprintf("127.0.0.1:%d", s.port))
	return s
}

// addUser makes a user of the test's own, in the given groups (none: no
// supplementary group), removed with its home when the test ends.
func addUser(t *testing.T, groups string) string {
	t.Helper()
	u := fmt.Sprintf("tct%d", time.Now().UnixNano()%1_000_000_000)
	args := []string{"-m", "-s", "/bin/sh"}
	if groups != "" {
		args = append(args, "-G", groups)
	}
	if out, err := exec.Command("useradd", append(args, u)...).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", "-r", u).Run() })
	// A locked account ("!") may not log in even with a key.
	if out, err := exec.Command("usermod", "-p", "*", u).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	return u
}

// sshPodman runs the podman users type (tclone's wrapper) with HOME (and
// Podman's configuration) in the sshd's directory, whose known_hosts holds
// its key: the ssh client reads HOME once per process, so each client runs
// in a process of its own.
func sshPodman(t *testing.T, d *sshd, args ...string) result {
	t.Helper()
	cmd := exec.Command(podmanCLI, args...)
	cmd.Env = append(os.Environ(), "HOME="+d.knownHome, "XDG_CONFIG_HOME="+filepath.Join(d.knownHome, ".config"))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		r.code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
	}
	return r
}

// sshFork runs podman container fork (podman-fork, the Go package's
// command) over ssh:// with the sshd's key.
func sshFork(t *testing.T, d *sshd, uri string, args ...string) result {
	t.Helper()
	return sshPodman(t, d, append([]string{"--url", uri, "--identity", d.key, "container", "fork"}, args...)...)
}

// A client over ssh:// to this host, logged in as a user who is not root
// but is in the socket's group: the fork runs in the service. A user outside
// the group is refused by the socket.
func TestRESTOverSSH(t *testing.T) {
	requireStack(t)
	rootKnown, _ := os.ReadFile("/root/.ssh/known_hosts")
	// The socket's directory is root's alone, as /run/tclone is once a
	// fork has made it: the service lets the group through.
	dir := publicTempDir(t, "tct-api-")
	os.Chmod(dir, 0o700)
	svc := startAPIServiceIn(t, dir, "--group", "tclone")
	src := shellSource(t)
	allowed := addUser(t, "tclone")
	d := startSSHD(t, allowed)
	uri := fmt.Sprintf("ssh://%s@127.0.0.1:%d%s", allowed, d.port, svc.socket)
	r := sshFork(t, d, uri, "--print-stats", "--label", "via=ssh", src)
	if r.code != 0 {
		t.Fatalf("fork over %s: exit %d: %s\nservice log:\n%s", uri, r.code, r.stderr, svc.log)
	}
	var st podmanfork.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Siblings) != 1 {
		t.Fatalf("fork over ssh printed %q: %v", r.stdout, err)
	}
	if got := state(t, st.Siblings[0].Name); got != "running" {
		t.Errorf("%s is %s", st.Siblings[0].Name, got)
	}
	if !strings.Contains(svc.log.String(), "fork of "+src+" for ") {
		t.Errorf("the fork did not run in the service:\n%s", svc.log)
	}

	// A connection saved with podman system connection add, as a remote
	// user would: Podman's own commands and the fork go through it.
	if r := sshPodman(t, d, "system", "connection", "add", "--identity", d.key, "tct-conn", uri); r.code != 0 {
		t.Fatalf("podman system connection add: %s", r.stderr)
	}
	if r := sshPodman(t, d, "--connection", "tct-conn", "ps", "--format", "{{.Names}}"); r.code != 0 || !strings.Contains(r.stdout, src) {
		t.Errorf("podman --connection ps: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := sshPodman(t, d, "--connection", "tct-conn", "container", "fork", src); r.code != 0 {
		t.Errorf("podman --connection container fork: %s", r.stderr)
	}
	if got := siblingsOf(t, src); len(got) != 2 {
		t.Errorf("siblings: %v, want 2", got)
	}

	// A user outside the group: the socket refuses, nothing is made.
	outsider := addUser(t, "")
	d2 := startSSHD(t, outsider)
	uri2 := fmt.Sprintf("ssh://%s@127.0.0.1:%d%s", outsider, d2.port, svc.socket)
	r = sshFork(t, d2, uri2, src)
	if r.code == 0 || !strings.Contains(r.stderr, "group tclone") {
		t.Errorf("a user outside the socket's group: exit %d %q", r.code, r.stderr)
	}
	if got := siblingsOf(t, src); len(got) != 2 {
		t.Errorf("siblings after the refused user: %v, want 2", got)
	}
	if after, _ := os.ReadFile("/root/.ssh/known_hosts"); string(after) != string(rootKnown) {
		t.Errorf("the ssh client wrote root's known_hosts, not the test's")
	}
}

// make ci-example, small: PostgreSQL forked into 4 shards over the REST
// endpoint, each shard writing to its own copy, the postmaster's children
// and its shared memory alive in every shard, the source untouched.
func TestCIExample(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	cmd := exec.Command("../../hack/ci-example.sh")
	cmd.Env = append(os.Environ(), "TCLONE_SOCKET="+svc.socket, "SCALE=2", "SEED_ROWS=300", "TEST_SECONDS=2", "SHARDS=4")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ci-example: %v\n%s\nservice log:\n%s", err, out, svc.log)
	}
	t.Logf("%s", out)
	if n := strings.Count(string(out), "sees only its own writes"); n != 4 {
		t.Errorf("%d shards checked, want 4", n)
	}
	for _, want := range []string{"the source database is untouched", "loading it once and forking took"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if left := podman(t, "ps", "-a", "--filter", "label=ci-example", "--format", "{{.Names}}"); left != "" {
		t.Errorf("ci-example left containers: %s", left)
	}
}

// kill -9 of tclone's API service in the middle of a fork, with its client
// still waiting: the client gets an error, and `tclone gc` (as the next
// fork would) rolls the dead service's call back: no sibling, no record, no
// plan, the source running. A service started again serves forks.
func TestRESTServiceKilledMidFork(t *testing.T) {
	requireStack(t)
	svc := startAPIService(t)
	src := shellSource(t)
	answered := make(chan result, 1)
	go func() {
		answered <- run(t, 5*time.Minute, "curl", "-sS", "--unix-socket", svc.socket, "-X", "POST", "-w", "\n%{http_code}",
			"http://d"+forkPath(src, url.Values{"count": {"3"}, "hook": {"sleep 30"}, "readyTimeout": {"2m"}}))
	}()
	eventually(t, 2*time.Minute, "a sibling made", func() error {
		if len(siblingsOf(t, src)) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	svc.cmd.Process.Signal(syscall.SIGKILL)
	<-svc.done
	if r := <-answered; r.code == 0 && strings.HasSuffix(strings.TrimSpace(r.stdout), "200") {
		t.Fatalf("the fork was answered 200 by a killed service: %q", r.stdout)
	}
	// A restore Podman was running for the dead service may still end
	// after a first collection; the call's record stays until its label
	// is swept, so a later gc removes that sibling too.
	requireRolledBack(t, src, func() error {
		if r := run(t, 3*time.Minute, tcloneBin(), "gc"); r.code != 0 {
			return fmt.Errorf("tclone gc: %s", r.stderr)
		}
		return nil
	})
	again := startAPIService(t)
	if status, body := again.curl(t, "POST", forkPath(src, nil)); status != 200 {
		t.Errorf("a fork through a new service: %d %s", status, body)
	}
}

// The light client's branch calls, through tclone's API service: create,
// list, inspect, start, a refused start, export, remove and import.
func TestGoClientBranchesOverREST(t *testing.T) {
	requireStack(t)
	branchStore(t)
	svc := startAPIService(t)
	src := shellSource(t)
	conn, err := bindings.NewConnection(context.Background(), "unix://"+svc.socket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := podmanfork.CreateBranch(conn, src, "gob1", podmanfork.BranchOptions{Labels: podmanfork.Labels{"stage": "one"}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := podmanfork.ListBranches(conn, src)
	if err != nil || len(list) != 1 || list[0].Name != "gob1" || list[0].Labels["stage"] != "one" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if b, err := podmanfork.InspectBranch(conn, "gob1"); err != nil || b.ID != st.Branch.ID {
		t.Fatalf("inspect: %+v, %v; want ID %s", b, err, st.Branch.ID)
	}
	stats, err := podmanfork.StartBranch(conn, "gob1", podmanfork.Options{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats.Siblings {
		t.Cleanup(func() { removeContainers(t, s.Name) })
		if got := state(t, s.Name); got != "running" {
			t.Errorf("%s is %s", s.Name, got)
		}
		if l := podman(t, "inspect", "--format", `{{index .Config.Labels "io.tclone.branch"}}`, s.Name); l != st.Branch.ID {
			t.Errorf("%s: label io.tclone.branch %q, want %s", s.Name, l, st.Branch.ID)
		}
	}
	_, err = podmanfork.StartBranch(conn, "gob1", podmanfork.Options{Fork: forkopts.Fork{Capture: forkopts.Capture{FileLocks: true}}})
	if !errors.Is(err, podmanfork.ErrInvalidOption) || !strings.Contains(err.Error(), "--file-locks says how the source is captured") {
		t.Errorf("a start with a capture option: %v, want ErrInvalidOption naming --file-locks", err)
	}
	var archive bytes.Buffer
	if err := podmanfork.ExportBranch(conn, "gob1", &archive); err != nil || archive.Len() == 0 {
		t.Fatalf("export: %d bytes, %v", archive.Len(), err)
	}
	if _, err := podmanfork.RemoveBranch(conn, "gob1"); err != nil {
		t.Fatal(err)
	}
	if _, err := podmanfork.InspectBranch(conn, "gob1"); !errors.Is(err, podmanfork.ErrNoSuchSource) {
		t.Errorf("inspect of a removed branch: %v, want ErrNoSuchSource", err)
	}
	b, err := podmanfork.ImportBranch(conn, &archive, podmanfork.ImportOptions{Name: "gob2"})
	if err != nil || b.Name != "gob2" || b.Source.Name != src {
		t.Fatalf("import: %+v, %v", b, err)
	}
	if _, err := podmanfork.RemoveBranch(conn, "gob2"); err != nil {
		t.Fatal(err)
	}
	requireNoLiveCalls(t)
}
