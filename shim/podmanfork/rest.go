package podmanfork

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/errorhandling"

	"github.com/tclone/tclone/runtime/forkopts"
)

// ServiceHeader is the response header by which tclone's API service (`tclone
// service`) makes itself known on every answer; its value is tclone's
// version. A service without it is Podman's own.
const ServiceHeader = "Tclone-Version"

// ForkEndpoint is the fork endpoint of tclone's API service, below the API
// version's /libpod, in the bindings' path-value form.
const ForkEndpoint = "/containers/%s/fork"

// serviceIsTclone asks the connection's service whether it is tclone's.
func serviceIsTclone(ctx context.Context) (bool, error) {
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

// forkOverREST asks tclone's API service to fork.
func forkOverREST(ctx context.Context, source string, opts Options) (*Stats, error) {
	conn, err := bindings.GetClient(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := conn.DoRequest(ctx, nil, http.MethodPost, ForkEndpoint, opts.Query(), nil, source)
	if err != nil {
		return nil, fmt.Errorf("fork of %s at %s: %w", source, conn.URI.Redacted(), err)
	}
	defer resp.Body.Close()
	var stats Stats
	if err := resp.Process(&stats); err != nil {
		var model *errorhandling.ErrorModel
		if errors.As(err, &model) {
			err = ofKind(kindOfStatus(model.ResponseCode), err)
		}
		return nil, err
	}
	return &stats, nil
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

// Query is the options as the fork endpoint's query parameters, named as
// `podman container fork`'s flags (podmanflags.FromQuery reads them back).
// The plan's life (Uses, TTL) is the service's to decide and is not sent.
func (o Options) Query() url.Values {
	q := url.Values{}
	set := func(key string, on bool, value string) {
		if on {
			q.Add(key, value)
		}
	}
	flag := func(key string, on bool) { set(key, on, "true") }
	for _, n := range o.Names {
		q.Add("name", n)
	}
	set("count", o.Count != 0, strconv.Itoa(o.Count))
	set("parallel", o.Parallel != 0, strconv.Itoa(o.Parallel))
	for _, p := range o.Publish {
		q.Add("publish", p)
	}
	flag("ignore-static-ip", o.IgnoreStaticIP)
	flag("ignore-static-mac", o.IgnoreStaticMAC)
	keys := make([]string, 0, len(o.Labels))
	for k := range o.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+o.Labels[k])
	}
	for _, m := range o.VolumeModes.Values() {
		q.Add("volume-mode", m)
	}
	for _, h := range o.Hooks {
		q.Add("hook", h)
	}
	set("ready", o.Ready.Kind != "", o.Ready.String())
	set("ready-timeout", o.ReadyTimeout != 0, o.ReadyTimeout.String())
	flag("wait-memory", o.WaitMemory)
	flag("tcp-established", o.TCP == forkopts.TCPKeep)
	flag("tcp-close", o.TCP == forkopts.TCPClose)
	flag("file-locks", o.FileLocks)
	flag("ext-unix-sk", o.ExtUnixSk)
	flag("shell-job", o.ShellJob)
	set("identity", o.Identity != "", string(o.Identity))
	set("memory", o.Memory != "", string(o.Memory))
	flag("files-only", o.FilesOnly)
	set("capture-timeout", o.CaptureTimeout != 0, o.CaptureTimeout.String())
	return q
}
