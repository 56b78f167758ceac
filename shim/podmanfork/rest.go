package podmanfork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/errorhandling"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/flagtable"
)

// ServiceHeader is the response header by which tclone's API service (`tclone
// service`) makes itself known on every answer; its value is tclone's
// version. A service without it is Podman's own.
const ServiceHeader = "Tclone-Version"

// The endpoints of tclone's API service, below the API version's /libpod,
// in the bindings' path-value form.
const (
	ForkEndpoint         = "/containers/%s/fork"
	BranchCreateEndpoint = "/containers/%s/branches"
	BranchesEndpoint     = "/branches"
	BranchEndpoint       = "/branches/%s"
	BranchVerbEndpoint   = "/branches/%s/%s"
	BranchImportEndpoint = "/branches/import"
)

// ForkQuery keeps the fields of Options the fork endpoint takes: all but
// the plan's life (Uses, TTL), which is the service's to decide.
var ForkQuery = flagtable.Not(flagtable.InGroups(forkopts.GroupPlan))

// CaptureOnly keeps the fields of Options that say how the source is
// captured: a branch decides them when it is created, so its start refuses
// them.
var CaptureOnly = flagtable.InGroups(forkopts.GroupCapture, forkopts.GroupFiles, forkopts.GroupTimeout, GroupVolumes)

// StartQuery keeps the fields of Options a branch's start takes: a fork's,
// less those of the capture, which the branch already is.
var StartQuery = flagtable.Not(flagtable.Or(flagtable.InGroups(forkopts.GroupPlan), CaptureOnly))

// CaptureOptionError refuses a capture option (flag) given to a branch's
// start.
func CaptureOptionError(flag string) error {
	return fmt.Errorf("--%s says how the source is captured, which the branch already is: give it to podman container branch create", flag)
}

// GroupVolumes is the group of the volume modes, which a branch's start
// takes from the branch.
const GroupVolumes = "volumes"

// IsTcloneService asks the connection's service whether it is tclone's.
func IsTcloneService(ctx context.Context) (bool, error) {
	conn, err := bindings.GetClient(ctx)
	if err != nil {
		return false, err
	}
	resp, err := conn.DoRequest(ctx, nil, http.MethodGet, "/_ping", nil, nil)
	if err != nil {
		return false, fmt.Errorf("asking the API service at %s what it is: %w", conn.URI.Redacted(), err)
	}
	defer resp.Body.Close()
	return resp.Header.Get(ServiceHeader) != "", nil
}

// requireTclone fails, saying what to connect to, unless the connection's
// service is tclone's.
func requireTclone(ctx context.Context) error {
	ok, err := IsTcloneService(ctx)
	if err != nil || ok {
		return err
	}
	conn, _ := bindings.GetClient(ctx)
	return WithKind(ErrNotTcloneService, fmt.Errorf("the API service at %s is Podman's own, which cannot fork: connect to tclone's API service "+
		"(`tclone service`, unix:///run/tclone/tclone.sock or ssh://USER@HOST/run/tclone/tclone.sock), "+
		"or fork on the Podman host with `podman container fork`", conn.URI.Redacted()))
}

// Fork forks the running container source into opts.Count siblings through
// tclone's API service on the connection in ctx (bindings.NewConnection).
// All or nothing: on any failure every sibling of this call is removed, the
// capture is discarded, and the source runs on untouched.
func Fork(ctx context.Context, source string, opts Options) ([]Result, error) {
	st, err := ForkWithStats(ctx, source, opts)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(st.Siblings))
	for i, r := range st.Siblings {
		out[i] = *r
	}
	return out, nil
}

// ForkWithStats is Fork, also returning timings of every phase. The
// options are checked here first, then sent; this process needs no access
// to the host.
func ForkWithStats(ctx context.Context, source string, opts Options) (*Stats, error) {
	if err := opts.Validate(); err != nil {
		return nil, WithKind(ErrInvalidOption, err)
	}
	var stats Stats
	err := call(ctx, http.MethodPost, ForkEndpoint, flagtable.Query(opts, ForkQuery), nil, &stats, source)
	if err != nil {
		return nil, fmt.Errorf("fork of %s: %w", source, err)
	}
	return &stats, nil
}

// CreateBranch captures the running container source, as a fork would, and
// keeps the capture on the service's host as branch name.
func CreateBranch(ctx context.Context, source, name string, opts BranchOptions) (*BranchStats, error) {
	if err := branch.CheckName(name); err != nil {
		return nil, WithKind(ErrInvalidOption, err)
	}
	if err := opts.Validate(); err != nil {
		return nil, WithKind(ErrInvalidOption, err)
	}
	q := flagtable.Query(opts, flagtable.All)
	q.Set("name", name)
	var stats BranchStats
	if err := call(ctx, http.MethodPost, BranchCreateEndpoint, q, nil, &stats, source); err != nil {
		return nil, fmt.Errorf("branch %s of %s: %w", name, source, err)
	}
	return &stats, nil
}

// StartBranch starts opts.Count siblings from the branch ref (a name or
// ID), with the same options and all-or-nothing rule as a fork, less those
// of the capture (StartQuery).
func StartBranch(ctx context.Context, ref string, opts Options) (*Stats, error) {
	if err := opts.Validate(); err != nil {
		return nil, WithKind(ErrInvalidOption, err)
	}
	for _, f := range flagtable.Fields(opts) {
		if CaptureOnly(f) && flagtable.Query(opts, flagtable.Named(f.Name)).Has(f.Name) {
			return nil, WithKind(ErrInvalidOption, CaptureOptionError(f.Name))
		}
	}
	var stats Stats
	if err := call(ctx, http.MethodPost, BranchVerbEndpoint, flagtable.Query(opts, StartQuery), nil, &stats, ref, "start"); err != nil {
		return nil, fmt.Errorf("start of branch %s: %w", ref, err)
	}
	return &stats, nil
}

// ListBranches lists the branches of source ("": of every source).
func ListBranches(ctx context.Context, source string) ([]branch.Info, error) {
	q := url.Values{}
	if source != "" {
		q.Set("source", source)
	}
	var list []branch.Info
	return list, call(ctx, http.MethodGet, BranchesEndpoint, q, nil, &list)
}

// InspectBranch is branch ref's record.
func InspectBranch(ctx context.Context, ref string) (*branch.Branch, error) {
	var b branch.Branch
	if err := call(ctx, http.MethodGet, BranchVerbEndpoint, nil, nil, &b, ref, "json"); err != nil {
		return nil, err
	}
	return &b, nil
}

// RemoveBranch removes branch ref.
func RemoveBranch(ctx context.Context, ref string) (*branch.Removed, error) {
	var r branch.Removed
	if err := call(ctx, http.MethodDelete, BranchEndpoint, nil, nil, &r, ref); err != nil {
		return nil, err
	}
	return &r, nil
}

// ExportBranch writes branch ref, as the service's host signs it, to w. An
// archive cut short by a failure midway is refused by an import.
func ExportBranch(ctx context.Context, ref string, w io.Writer) error {
	if err := requireTclone(ctx); err != nil {
		return err
	}
	conn, err := bindings.GetClient(ctx)
	if err != nil {
		return err
	}
	resp, err := conn.DoRequest(ctx, nil, http.MethodGet, BranchVerbEndpoint, nil, nil, ref, "export")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return answerError(resp.Process(nil))
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// ImportBranch imports the archive read from r (ExportBranch, or podman
// container branch export) on the service's host.
func ImportBranch(ctx context.Context, r io.Reader, opts ImportOptions) (*branch.Branch, error) {
	var b branch.Branch
	if err := call(ctx, http.MethodPost, BranchImportEndpoint, flagtable.Query(opts, flagtable.All), r, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// call makes a request of tclone's API service and decodes its answer
// into out.
func call(ctx context.Context, method, endpoint string, q url.Values, body io.Reader, out any, pathValues ...string) error {
	if err := requireTclone(ctx); err != nil {
		return err
	}
	conn, err := bindings.GetClient(ctx)
	if err != nil {
		return err
	}
	resp, err := conn.DoRequest(ctx, body, method, endpoint, q, nil, pathValues...)
	if err != nil {
		return fmt.Errorf("at %s: %w", conn.URI.Redacted(), err)
	}
	defer resp.Body.Close()
	return answerError(resp.Process(out))
}

// answerError gives the service's error its kind.
func answerError(err error) error {
	var model *errorhandling.ErrorModel
	if errors.As(err, &model) {
		if kind := kindOfStatus(model.ResponseCode); kind != nil {
			return WithKind(kind, err)
		}
	}
	return err
}

// kindOfStatus is HTTPStatus the other way round.
func kindOfStatus(status int) error {
	switch status {
	case http.StatusBadRequest:
		return ErrInvalidOption
	case http.StatusNotFound:
		return ErrNoSuchSource
	case http.StatusConflict:
		return ErrConflict
	}
	return nil
}
