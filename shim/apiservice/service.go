// Package apiservice is tclone's API service: Podman's libpod API, served
// unchanged by handing every request to Podman's own service, plus the fork
// endpoint
//
//	POST /{version}/libpod/containers/{name}/fork?count=2&label=k=v&...
//
// whose query parameters are `podman container fork`'s flags, and which
// answers the fork's stats as JSON, or Podman's error body and status. The
// service owns fork requests for its host: clients need no access to it but
// the socket, locally or over ssh.
package apiservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/errorhandling"
	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/shim/forkflags/podmanflags"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// Service serves the API. Its zero value is not usable: see New.
type Service struct {
	agent   *hostagent.Agent
	podman  string // Podman's socket
	version string
	proxy   *httputil.ReverseProxy
	// fork runs a fork; tests replace it.
	fork func(ctx context.Context, source string, opts podmanfork.Options) (*podmanfork.Stats, error)

	// forks are the fork requests under way. Shutdown waits for them, and
	// at its deadline cancels them through stopForks: a cancelled fork
	// rolls back.
	mu        sync.Mutex
	draining  bool
	forks     sync.WaitGroup
	forkCtx   context.Context
	stopForks context.CancelCauseFunc
}

// New serves the API of the Podman service listening on the unix socket
// podmanSocket, with agent doing the host's work; version is what
// ServiceHeader says.
func New(agent *hostagent.Agent, podmanSocket, version string) *Service {
	s := &Service{agent: agent, podman: podmanSocket, version: version}
	s.forkCtx, s.stopForks = context.WithCancelCause(context.Background())
	s.fork = s.forkHere
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", podmanSocket)
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "d"
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			DialContext:         dial,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
			// Bodies pass as they are: an image layer stays compressed.
			DisableCompression: true,
		},
		// Streams (events, logs --follow, stats) reach the client at once.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set(podmanfork.ServiceHeader, version)
			return nil
		},
		ErrorHandler: s.proxyError,
	}
	return s
}

// forkPath is the fork endpoint, with or without the version prefix.
var forkPath = regexp.MustCompile(`^(?:/v\d[\d.]*)?/libpod/containers/([^/]+)/fork$`)

// ServeHTTP implements http.Handler.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m := forkPath.FindStringSubmatch(r.URL.Path); m != nil {
		s.serveFork(w, r, m[1])
		return
	}
	if s.routeBranches(w, r) {
		return
	}
	if hijacks(r) {
		s.splice(w, r)
		return
	}
	s.proxy.ServeHTTP(w, r)
}

func (s *Service) serveFork(w http.ResponseWriter, r *http.Request, source string) {
	w.Header().Set(podmanfork.ServiceHeader, s.version)
	if !allow(w, r, http.MethodPost) {
		return
	}
	opts, err := podmanflags.FromQuery(r.URL.Query())
	if err == nil {
		err = hostagent.Validate(opts)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	s.long(w, r, "fork of "+source, func(ctx context.Context) (any, error) { return s.fork(ctx, source, opts) })
}

// startFork registers a fork request. Its context ends when the client goes
// away (the fork then rolls back) or when Shutdown gives up waiting.
func (s *Service) startFork(req context.Context) (context.Context, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return nil, nil, errors.New("tclone's API service is stopping and takes no new fork; retry once it is started again")
	}
	s.forks.Add(1)
	ctx, cancel := context.WithCancelCause(req)
	stop := context.AfterFunc(s.forkCtx, func() { cancel(context.Cause(s.forkCtx)) })
	return ctx, func() {
		stop()
		cancel(nil)
		s.forks.Done()
	}, nil
}

// forkHere runs a fork through Podman's service.
func (s *Service) forkHere(ctx context.Context, source string, opts podmanfork.Options) (*podmanfork.Stats, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	return s.agent.ForkHere(conn, source, opts)
}

// connect returns ctx with a connection to Podman's service.
func (s *Service) connect(ctx context.Context) (context.Context, error) {
	conn, err := bindings.NewConnection(ctx, "unix://"+s.podman)
	if err != nil {
		return nil, s.podmanDown(err)
	}
	return conn, nil
}

// Shutdown takes no new fork, and waits for the forks under way until ctx
// ends; then it cancels them, and waits for their rollback.
func (s *Service) Shutdown(ctx context.Context) {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.forks.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	logrus.Warnf("forks still under way at shutdown are cancelled and rolled back")
	s.stopForks(errors.New("tclone's API service is stopping"))
	<-done
}

// proxyError answers a request Podman's service could not be asked.
func (s *Service) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client left
	}
	if down := s.podmanDown(err); errors.As(down, new(unavailable)) {
		writeError(w, http.StatusServiceUnavailable, down)
		return
	}
	writeError(w, http.StatusBadGateway, fmt.Errorf("passing %s %s to Podman's service at %s: %w", r.Method, r.URL.Path, s.podman, err))
}

// unavailable is an error that means Podman's service is not there.
type unavailable struct{ error }

func (u unavailable) Unwrap() error { return u.error }

// podmanDown explains an error that means Podman's service is not there,
// as unavailable; other errors are returned as they are.
func (s *Service) podmanDown(err error) error {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return unavailable{fmt.Errorf("the Podman API service does not answer at %s (%w): start it with `systemctl start podman.socket`, "+
			"or, where systemd does not run, hack/podman-service.sh start", s.podman, err)}
	}
	return err
}

// writeError answers err as Podman's API does.
func writeError(w http.ResponseWriter, status int, err error) {
	cause := err
	for {
		next := errors.Unwrap(cause)
		if next == nil {
			break
		}
		cause = next
	}
	writeJSON(w, status, errorhandling.ErrorModel{Because: cause.Error(), Message: err.Error(), ResponseCode: status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		logrus.Debugf("writing the answer: %v", err)
	}
}

// clientOf names a request's client for the log.
func clientOf(r *http.Request) string {
	if r.RemoteAddr != "" && r.RemoteAddr != "@" {
		return r.RemoteAddr
	}
	return "a local client"
}
