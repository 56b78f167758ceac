package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// freezer makes a fake cgroup directory whose freezer file (v1's
// freezer.state or v2's cgroup.freeze) holds state.
func freezer(t *testing.T, v2 bool, state string) (*Freezer, string) {
	t.Helper()
	f := &Freezer{Dir: t.TempDir(), V2: v2}
	file := filepath.Join(f.Dir, "freezer.state")
	if v2 {
		file = filepath.Join(f.Dir, "cgroup.freeze")
	}
	if err := os.WriteFile(file, []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	return f, file
}

func read(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFrozen(t *testing.T) {
	for _, c := range []struct {
		v2    bool
		state string
		want  bool
	}{
		{false, "FROZEN\n", true},
		{false, "FREEZING\n", true},
		{false, "THAWED\n", false},
		{true, "1\n", true},
		{true, "0\n", false},
	} {
		f, _ := freezer(t, c.v2, c.state)
		if got, err := f.Frozen(); err != nil || got != c.want {
			t.Errorf("v2=%v %q: Frozen() = %v, %v; want %v", c.v2, c.state, got, err, c.want)
		}
	}
	for _, v2 := range []bool{false, true} {
		f := &Freezer{Dir: filepath.Join(t.TempDir(), "gone"), V2: v2}
		if _, err := f.Frozen(); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("v2=%v, no cgroup: %v, want not-exist", v2, err)
		}
	}
}

// Thaw writes the thawed state of the cgroup's version, and returns once
// the cgroup reads as thawed.
func TestThaw(t *testing.T) {
	for v2, want := range map[bool]string{false: "THAWED", true: "0"} {
		f, file := freezer(t, v2, map[bool]string{false: "FROZEN\n", true: "1\n"}[v2])
		if err := f.Thaw(); err != nil {
			t.Fatalf("v2=%v: %v", v2, err)
		}
		if got := read(t, file); got != want {
			t.Errorf("v2=%v: thawed freezer file holds %q, want %q", v2, got, want)
		}
	}
}

// A cgroup that is gone has nothing to thaw.
func TestThawGoneCgroup(t *testing.T) {
	f := &Freezer{Dir: filepath.Join(t.TempDir(), "gone")}
	if err := f.Thaw(); err != nil {
		t.Errorf("Thaw of a removed cgroup: %v", err)
	}
	if was, err := f.ThawIfFrozen(); was || err != nil {
		t.Errorf("ThawIfFrozen of a removed cgroup: %v, %v; want false, nil", was, err)
	}
}

// A freezer file that cannot be written or read is an error that names
// the cgroup.
func TestThawFailure(t *testing.T) {
	f := &Freezer{Dir: t.TempDir()}
	if err := os.Mkdir(filepath.Join(f.Dir, "freezer.state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.Thaw(); err == nil || !strings.HasPrefix(err.Error(), "thawing "+f.Dir+": ") {
		t.Errorf("Thaw of an unwritable freezer: %v, want an error naming %s", err, f.Dir)
	}
	if _, err := f.ThawIfFrozen(); err == nil {
		t.Error("ThawIfFrozen of an unreadable freezer: no error")
	}
}

// ThawIfFrozen thaws a frozen cgroup and says so; a thawed one it leaves
// untouched.
func TestThawIfFrozen(t *testing.T) {
	f, file := freezer(t, false, "FROZEN\n")
	if was, err := f.ThawIfFrozen(); !was || err != nil {
		t.Fatalf("frozen cgroup: ThawIfFrozen() = %v, %v; want true, nil", was, err)
	}
	if got := read(t, file); got != "THAWED" {
		t.Errorf("after ThawIfFrozen, freezer.state holds %q", got)
	}
	f, file = freezer(t, true, "0\n")
	if was, err := f.ThawIfFrozen(); was || err != nil {
		t.Fatalf("thawed cgroup: ThawIfFrozen() = %v, %v; want false, nil", was, err)
	}
	// Thaw would have written "0" without the newline.
	if got := read(t, file); got != "0\n" {
		t.Errorf("a thawed cgroup's cgroup.freeze was written: %q", got)
	}
}

func TestProcs(t *testing.T) {
	dir := t.TempDir()
	if _, err := Procs(dir); err == nil || !strings.Contains(err.Error(), "listing the processes of cgroup "+dir) {
		t.Errorf("no cgroup.procs: %v, want an error naming %s", err, dir)
	}
	for content, want := range map[string][]int{"": nil, "12\n345\n": {12, 345}} {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := Procs(dir); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("cgroup.procs %q: %v, %v; want %v", content, got, err, want)
		}
	}
}

// A cgroup's limits are its own and its ancestors', up to but not
// including the root cgroup.
func TestLineage(t *testing.T) {
	for path, want := range map[string][]string{
		"/libpod_parent/libpod-1": {"/r/libpod_parent/libpod-1", "/r/libpod_parent"},
		"a/b/":                    {"/r/a/b", "/r/a"},
		"/":                       nil,
	} {
		if got := lineage("/r", path); !reflect.DeepEqual(got, want) {
			t.Errorf("lineage(%q) = %v, want %v", path, got, want)
		}
	}
}

// free reads limit less usage, and knows every way a cgroup says it has no
// limit.
func TestFree(t *testing.T) {
	for _, c := range []struct {
		max, cur    string // "" for no file
		free        uint64
		limited     bool
		errContains string
	}{
		{"100\n", "30\n", 70, true, ""},
		{"100", "100", 0, true, ""},
		{"100", "150", 0, true, ""},
		{"max\n", "5", 0, false, ""},
		{"9223372036854771712\n", "4096", 0, false, ""}, // v1's unlimited memory: MaxInt64 page-aligned
		{"", "", 0, false, ""},                          // controller not enabled here
		{"lots", "1", 0, false, `"lots" is no number`},
		{"100", "", 0, false, "no such file"},
	} {
		dir := t.TempDir()
		for file, v := range map[string]string{"x.max": c.max, "x.current": c.cur} {
			if v != "" {
				if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, limited, err := free(dir, "x.max", "x.current")
		if c.errContains != "" {
			if err == nil || !strings.Contains(err.Error(), c.errContains) {
				t.Errorf("max %q cur %q: %v, want an error saying %q", c.max, c.cur, err, c.errContains)
			}
			continue
		}
		if err != nil || got != c.free || limited != c.limited {
			t.Errorf("max %q cur %q: free %d limited %v %v; want %d %v", c.max, c.cur, got, limited, err, c.free, c.limited)
		}
	}
}
