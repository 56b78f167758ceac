package hostagent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
)

// fakeExecService answers what an exec's attach asks of Podman's service:
// the ping, the session's inspection, and its start, whose stream carries
// "out-ID" on stdout.
func fakeExecService(t *testing.T) string {
	sock := filepath.Join(t.TempDir(), "podman.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch last := parts[len(parts)-1]; {
		case last == "_ping":
			w.Header().Set("Libpod-API-Version", "5.4.2")
		case last == "json":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"ProcessConfig":{"tty":false}}`)
		case last == "start":
			id := parts[len(parts)-2]
			conn, rw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			rw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n\r\n")
			rw.Flush()
			// The client reads the stream from its socket, past the
			// response it parsed: the stream comes after.
			time.Sleep(20 * time.Millisecond)
			payload := []byte("out-" + id)
			hdr := make([]byte, 8)
			hdr[0] = 1
			binary.BigEndian.PutUint32(hdr[4:], uint32(len(payload)))
			conn.Write(append(hdr, payload...))
		default:
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + sock
}

// Attaches of execs run at once on one connection (hooks and readiness
// checks of siblings restored in parallel) each get their own connection:
// the bindings swap the connection's transport to catch their socket, and
// two at once on one connection left one reading from no socket (a panic).
func TestConcurrentAttachesOwnTheirConnection(t *testing.T) {
	ctx, err := bindings.NewConnection(context.Background(), fakeExecService(t))
	if err != nil {
		t.Fatal(err)
	}
	shared, _ := bindings.GetClient(ctx)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("attach %d panicked: %v", i, p)
				}
			}()
			actx, release, err := attachConnection(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer release()
			if own, _ := bindings.GetClient(actx); own == shared {
				t.Errorf("attach %d uses the shared connection", i)
			}
			var buf bytes.Buffer
			var w io.Writer = &buf
			attach := true
			id := fmt.Sprintf("s%d", i)
			err = containers.ExecStartAndAttach(actx, id, &containers.ExecStartAndAttachOptions{
				OutputStream: &w, ErrorStream: &w, AttachOutput: &attach, AttachError: &attach,
			})
			if err != nil || buf.String() != "out-"+id {
				t.Errorf("attach %d: %q, %v; want out-%s", i, buf.String(), err, id)
			}
		}()
	}
	wg.Wait()
}
