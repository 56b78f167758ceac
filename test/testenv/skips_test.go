package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// skipCall is a call that ends a test as skipped.
var skipCall = regexp.MustCompile(`\.(Skip|Skipf|SkipNow)\(`)

// allowMark, on the line of such a call, says why the skip can never hide
// an untested path in make test.
const allowMark = "testenv: skip allowed:"

// No test of the project skips but through this package: a skip anywhere
// else would pass make test without running its path.
func TestNoSkipOutsideTestenv(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	top := filepath.Join(filepath.Dir(self), "..", "..")
	var bad []string
	err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "_build", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == filepath.Dir(self) {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if skipCall.MatchString(line) && !strings.Contains(line, allowMark) {
				rel, _ := filepath.Rel(top, path)
				bad = append(bad, rel+":"+strconv.Itoa(n)+": "+strings.TrimSpace(line))
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("a skip outside test/testenv (use testenv.Missing or testenv.InVM): %s", b)
	}
}

// Missing fails under the switch and skips without it; InVM always skips.
func TestMissingFollowsTheSwitch(t *testing.T) {
	for _, required := range []string{"1", "0", ""} {
		t.Setenv(Env, required)
		got := outcome(func(tb testing.TB) { Missing(tb, "crun not found") })
		want := "skipped"
		if required == "1" {
			want = "failed"
		}
		if got != want {
			t.Errorf("%s=%q: Missing %s, want %s", Env, required, got, want)
		}
		if got := outcome(func(tb testing.TB) { InVM(tb, "stack", "needs the module") }); got != "skipped" {
			t.Errorf("%s=%q: InVM %s, want skipped", Env, required, got)
		}
	}
}

// recorder is a testing.TB that records how a test ended.
type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Helper()                   {}
func (r *recorder) Fatalf(f string, a ...any) { r.failed = true; panic(r) }
func (r *recorder) Skipf(f string, a ...any)  { r.skipped = true; panic(r) }

func outcome(fn func(testing.TB)) (got string) {
	r := &recorder{}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
		switch {
		case r.failed:
			got = "failed"
		case r.skipped:
			got = "skipped"
		default:
			got = "ran"
		}
	}()
	fn(r)
	return "ran"
}
