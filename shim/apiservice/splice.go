package apiservice

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"

	"github.com/sirupsen/logrus"
)

// streamPath is the endpoints on which Podman takes over the connection
// (attach, exec start), whether or not the client asks to upgrade it.
var streamPath = regexp.MustCompile(`^(?:/v\d[\d.]*)?(?:/libpod)?/(?:containers/[^/]+/attach|exec/[^/]+/start)$`)

// maxSpliceBody bounds the body of a request whose connection is taken
// over: it is read whole before (an exec start's JSON is a few bytes).
const maxSpliceBody = 1 << 20

// hijacks tells whether Podman takes the request's connection over: the
// client and Podman then talk raw streams both ways on it.
func hijacks(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" || (r.Method == http.MethodPost && streamPath.MatchString(r.URL.Path))
}

// splice hands the request to Podman on a connection of its own, then
// joins the client's connection to it both ways until Podman ends it.
func (s *Service) splice(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxSpliceBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
		return
	}
	if len(body) > maxSpliceBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s %s: a body of more than %d bytes", r.Method, r.URL.Path, maxSpliceBody))
		return
	}
	up, err := net.Dial("unix", s.podman)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, s.podmanDown(err))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		writeError(w, http.StatusInternalServerError, fmt.Errorf("%s %s: this connection cannot be taken over", r.Method, r.URL.Path))
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		logrus.Warnf("taking over the connection of %s %s: %v", r.Method, r.URL.Path, err)
		return
	}
	out := r.Clone(r.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.RequestURI = ""
	if err := out.Write(up); err != nil {
		client.Close()
		up.Close()
		return
	}
	// What the client sent after the request (stdin, already read ahead).
	toUp := io.MultiReader(io.LimitReader(buf.Reader, int64(buf.Reader.Buffered())), client)
	join(client, up, toUp)
}

// join copies from the client (through fromClient) to Podman and from
// Podman to the client. The client's end of input is passed on as a
// half-close; Podman ending its side ends the session.
func join(client, up net.Conn, fromClient io.Reader) {
	go func() {
		io.Copy(up, fromClient)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	io.Copy(client, up)
	client.Close()
	up.Close()
}
