package podmanfork

import (
	"errors"
	"net/http"

	"github.com/containers/podman/v5/pkg/errorhandling"

	"github.com/tclone/tclone/runtime/branch"
)

// The kinds of fork failure a caller can act on. A fork's error wraps one
// of them when it is of that kind (errors.Is), and its message is the
// failure's own: the kind adds no words.
var (
	// ErrInvalidOption: an option was refused before anything was made.
	ErrInvalidOption = errors.New("invalid fork option")
	// ErrConflict: the source cannot be forked as it is (paused, stopped,
	// not run by tclone), or a sibling's name or port is held by another
	// container.
	ErrConflict = errors.New("conflict")
	// ErrNoSuchSource: Podman knows no such container, or the host no
	// such branch.
	ErrNoSuchSource = errors.New("no such container")
	// ErrNotTcloneService: the connection's service is Podman's own,
	// which has none of tclone's endpoints.
	ErrNotTcloneService = errors.New("not tclone's API service")
)

// kindError is an error of a kind.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// WithKind tags err with kind; nil stays nil.
func WithKind(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

// HTTPStatus is the status Podman's API would answer a fork's error with:
// 400 for a bad option, 404 for an unknown source or branch, 409 for a conflict, the
// Podman service's own status for what it refused, else 500.
func HTTPStatus(err error) int {
	var model *errorhandling.ErrorModel
	switch {
	case errors.Is(err, ErrInvalidOption):
		return http.StatusBadRequest
	case errors.Is(err, ErrNoSuchSource), errors.Is(err, branch.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.As(err, &model) && model.ResponseCode >= 400:
		return model.ResponseCode
	}
	return http.StatusInternalServerError
}
