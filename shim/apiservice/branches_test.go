package apiservice

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tclone/tclone/runtime/branch"
	"github.com/tclone/tclone/runtime/plan"
	"github.com/tclone/tclone/shim/hostagent"
)

// Branches may be called prune or import: those endpoints are POSTs
// without a verb, and a branch itself is deleted with DELETE.
func TestBranchNamedLikeAnEndpoint(t *testing.T) {
	dir := t.TempDir()
	store := branch.Store{Dir: dir}
	for _, name := range []string{"prune", "import"} {
		w, err := store.Begin(name, branch.Source{Name: "ws"})
		if err != nil {
			t.Fatal(err)
		}
		plan := t.TempDir()
		os.WriteFile(filepath.Join(plan, "plan.json"), []byte("{}"), 0o600)
		if err := w.AddPlan(context.Background(), plan); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Commit(func(*branch.Branch) {}); err != nil {
			t.Fatal(err)
		}
	}
	layout := plan.LayoutUnder(t.TempDir())
	layout.Branches = dir
	s := New(hostagent.New(layout), filepath.Join(t.TempDir(), "no-podman.sock"), "test-version")
	do := func(method, path string) (int, string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(method, "http://d/v5.4.2/libpod/branches"+path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := do(http.MethodPost, "/prune?keep-last=5"); code != 200 || !strings.Contains(body, `"remove":[]`) {
		t.Errorf("POST /branches/prune: %d %s, want a prune plan", code, body)
	}
	if code, body := do(http.MethodGet, "/prune/json"); code != 200 || !strings.Contains(body, `"name":"prune"`) {
		t.Errorf("GET /branches/prune/json: %d %s", code, body)
	}
	for _, name := range []string{"prune", "import"} {
		if code, body := do(http.MethodDelete, "/"+name); code != 200 {
			t.Errorf("DELETE /branches/%s: %d %s", name, code, body)
		}
	}
	if infos, _ := store.List(); len(infos) != 0 {
		t.Errorf("left: %+v", infos)
	}
}

// An import's image parameters are taken out of the query before the
// import's own flags read it; tls-verify goes with image only.
func TestImageQuery(t *testing.T) {
	q := url.Values{"image": {"localhost:5000/ws:b"}, "tls-verify": {"false"}, "name": {"b"}}
	image, skip, err := imageQuery(q)
	if err != nil || image != "localhost:5000/ws:b" || !skip || len(q) != 1 || q.Get("name") != "b" {
		t.Fatalf("imageQuery: %q %v %v, left %v", image, skip, err, q)
	}
	if _, skip, err := imageQuery(url.Values{"image": {"i"}}); err != nil || skip {
		t.Fatalf("without tls-verify: %v %v", skip, err)
	}
	for _, bad := range []url.Values{{"tls-verify": {"false"}}, {"image": {"i"}, "tls-verify": {"maybe"}}} {
		if _, _, err := imageQuery(bad); err == nil {
			t.Errorf("imageQuery(%v) took it", bad)
		}
	}
}
