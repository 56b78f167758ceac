package apiservice

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/tclone/tclone/shim/forkflags/podmanflags"
	"github.com/tclone/tclone/shim/hostagent"
	"github.com/tclone/tclone/shim/podmanfork"
)

// The branch endpoints, beside Podman's API (with or without its version
// prefix), as `podman container branch` has them:
//
//	POST   /libpod/containers/{name}/branches?name=B&label=k=v   create
//	GET    /libpod/branches[?source=S]                             ls
//	GET    /libpod/branches/{branch}/json                          inspect
//	GET    /libpod/branches/{branch}/diff?with=B                   diff
//	POST   /libpod/branches/{branch}/start?count=3&...             start
//	DELETE /libpod/branches/{branch}                               rm
//	POST   /libpod/branches/prune?keep-last=N&older-than=D&yes=true prune
//	GET    /libpod/branches/{branch}/export                        export (the archive)
//	POST   /libpod/branches/{branch}/export?image=I&parent-image=P export --image (a checkpoint image)
//	POST   /libpod/branches/import?name=N&trust=KEY&insecure-unsigned=true
//	POST   /libpod/branches/import?image=I&tls-verify=false&name=N  import --image
//	                                                               import (the archive as body)
var (
	branchCreatePath = regexp.MustCompile(`^(?:/v\d[\d.]*)?/libpod/containers/([^/]+)/branches$`)
	branchesPath     = regexp.MustCompile(`^(?:/v\d[\d.]*)?/libpod/branches(?:/([^/]+)(?:/(json|diff|start|export))?)?$`)
)

// routeBranches serves r when it is a branch request.
func (s *Service) routeBranches(w http.ResponseWriter, r *http.Request) bool {
	if m := branchCreatePath.FindStringSubmatch(r.URL.Path); m != nil {
		w.Header().Set(podmanfork.ServiceHeader, s.version)
		if !allow(w, r, http.MethodPost) {
			return true
		}
		name, opts, err := podmanflags.BranchCreateFromQuery(r.URL.Query())
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return true
		}
		s.long(w, r, "branch of "+m[1], func(ctx context.Context) (any, error) {
			conn, err := s.connect(ctx)
			if err != nil {
				return nil, err
			}
			return s.agent.CreateBranch(conn, m[1], name, opts, nil)
		})
		return true
	}
	m := branchesPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return false
	}
	w.Header().Set(podmanfork.ServiceHeader, s.version)
	ref, verb := m[1], m[2]
	store := s.agent.Branches()
	switch {
	case ref == "" && verb == "":
		if allow(w, r, http.MethodGet) {
			answer(w, r, func() (any, error) { return store.ListOf(r.URL.Query().Get("source")) })
		}
	// prune and import are POSTs without a verb; a branch itself takes
	// DELETE, so branches may be called prune or import too.
	case ref == "prune" && verb == "" && r.Method == http.MethodPost:
		answer(w, r, func() (any, error) {
			rule, yes, err := podmanflags.BranchPruneFromQuery(r.URL.Query())
			if err != nil {
				return nil, badRequest(err)
			}
			return store.Prune(rule, time.Now(), yes)
		})
	case ref == "import" && verb == "" && r.Method == http.MethodPost:
		q := r.URL.Query()
		image, skipTLS, err := imageQuery(q)
		var opts podmanfork.ImportOptions
		if err == nil {
			opts, err = podmanflags.ImportFromQuery(q)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			break
		}
		opts.SkipTLSVerify = skipTLS
		s.long(w, r, "import of a branch", func(ctx context.Context) (any, error) {
			conn, err := s.connect(ctx)
			if err != nil {
				return nil, err
			}
			if image != "" {
				return s.agent.ImportBranchImage(conn, image, opts)
			}
			return s.agent.ImportBranchFrom(conn, r.Body, "the request's body", opts)
		})
	case verb == "export" && r.Method == http.MethodPost:
		q := r.URL.Query()
		image, parent := q.Get("image"), q.Get("parent-image")
		q.Del("image")
		q.Del("parent-image")
		if image == "" || len(q) > 0 {
			writeError(w, http.StatusBadRequest, errors.New("POST .../export writes a checkpoint image: give ?image=NAME, and ?parent-image=IMAGE for a delta over it (GET .../export sends the archive)"))
			break
		}
		s.long(w, r, "checkpoint image of branch "+ref, func(ctx context.Context) (any, error) {
			conn, err := s.connect(ctx)
			if err != nil {
				return nil, err
			}
			return s.agent.ExportBranchImage(conn, ref, image, parent)
		})
	case verb == "export":
		if !allow(w, r, http.MethodGet) {
			break
		}
		b, err := store.Get(ref)
		if err != nil {
			writeError(w, statusOf(err), err)
			break
		}
		w.Header().Set("Content-Type", "application/zstd")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", b.Name+".tar.zst"))
		// A failure midway cuts the archive short, which an import
		// refuses.
		if _, err := s.agent.ExportBranch(b.ID, w); err != nil {
			logrus.Warnf("exporting branch %s to %s: %v", b.Name, clientOf(r), err)
		}
	case verb == "json":
		if allow(w, r, http.MethodGet) {
			answer(w, r, func() (any, error) { return store.Get(ref) })
		}
	case verb == "diff":
		if allow(w, r, http.MethodGet) {
			answer(w, r, func() (any, error) {
				with := r.URL.Query().Get("with")
				if with == "" {
					return nil, badRequest(errors.New("give the branch to compare with: ?with=NAME"))
				}
				return store.Compare(ref, with)
			})
		}
	case verb == "start":
		if !allow(w, r, http.MethodPost) {
			break
		}
		opts, err := podmanflags.BranchStartFromQuery(r.URL.Query())
		if err == nil {
			err = hostagent.Validate(opts)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			break
		}
		s.long(w, r, "start of branch "+ref, func(ctx context.Context) (any, error) {
			conn, err := s.connect(ctx)
			if err != nil {
				return nil, err
			}
			return s.agent.StartBranch(conn, ref, opts)
		})
	default: // a branch itself
		if allow(w, r, http.MethodDelete) {
			answer(w, r, func() (any, error) { return store.Remove(ref) })
		}
	}
	return true
}

// imageQuery takes an import's image parameters out of q: the image, and
// whether tls-verify=false asks to pull it without TLS checks.
func imageQuery(q url.Values) (image string, skipTLS bool, err error) {
	image = q.Get("image")
	if v := q.Get("tls-verify"); v != "" {
		verify, perr := strconv.ParseBool(v)
		if perr != nil || image == "" {
			return "", false, fmt.Errorf("tls-verify=%q: give true or false, with image=NAME", v)
		}
		skipTLS = !verify
	}
	q.Del("image")
	q.Del("tls-verify")
	return image, skipTLS, nil
}

// allow answers 405 unless r is a method.
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s %s: use %s", r.Method, r.URL.Path, method))
	return false
}

// badRequest marks an error of the request's own.
func badRequest(err error) error { return requestError{err} }

type requestError struct{ error }

func (e requestError) Unwrap() error { return e.error }

func statusOf(err error) int {
	switch {
	case errors.As(err, new(requestError)):
		return http.StatusBadRequest
	case errors.As(err, new(unavailable)):
		return http.StatusServiceUnavailable
	}
	return podmanfork.HTTPStatus(err)
}

// answer runs a quick request against the branch store.
func answer(w http.ResponseWriter, r *http.Request, fn func() (any, error)) {
	v, err := fn()
	if err != nil {
		logrus.Debugf("%s %s: %v", r.Method, r.URL.Path, err)
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// long runs a request that captures or starts containers through Podman: the
// service waits for it at shutdown, and a client that goes away cancels
// it, which rolls it back.
func (s *Service) long(w http.ResponseWriter, r *http.Request, what string, fn func(ctx context.Context) (any, error)) {
	ctx, done, err := s.startFork(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	defer done()
	start := time.Now()
	v, err := fn(ctx)
	if err != nil {
		status := statusOf(err)
		logrus.Warnf("%s for %s failed (%d) after %s: %v", what, clientOf(r), status, time.Since(start).Round(time.Millisecond), err)
		writeError(w, status, err)
		return
	}
	logrus.Infof("%s for %s done in %s", what, clientOf(r), time.Since(start).Round(time.Millisecond))
	writeJSON(w, http.StatusOK, v)
	// On the wire before the request counts as done: Shutdown, which
	// waits for it, then closes the connections.
	if err := http.NewResponseController(w).Flush(); err != nil {
		logrus.Debugf("sending the answer: %v", err)
	}
}
