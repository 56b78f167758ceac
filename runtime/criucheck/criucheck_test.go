package criucheck

import "testing"

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{
		"Version: 4.2.1\n":                        40201,
		"Version: 4.1\nGitID: v4.1-3-gabc\n":      40100,
		"Version: 3.17.1\n":                       31701,
		"criu: warning\nVersion: 4.2\nGitID: x\n": 40200,
	} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseVersion("criu: command not found"); err == nil {
		t.Error("garbage parsed as a version")
	}
}

func TestRequiredByKernel(t *testing.T) {
	cases := []struct {
		kernel string
		min    Version
	}{
		{"6.18.44-fc-v782", 40200},
		{"6.16.0", 40200},
		{"6.15.9-arch1", 31500},
		{"6.12.117+deb13-cloud-amd64", 31500},
		{"7.3.4+deb13-cloud-amd64", 40200},
	}
	for _, c := range cases {
		k, err := ParseKernel(c.kernel)
		if err != nil {
			t.Fatal(err)
		}
		if got := Required(k).Min; got != c.min {
			t.Errorf("kernel %s: min %v, want %v", c.kernel, got, c.min)
		}
	}
}

func TestNoBreakpointsWorkaround(t *testing.T) {
	if !NeedsNoBreakpointsWorkaround(40101) {
		t.Error("CRIU 4.1.1 hangs where hardware breakpoints do not fire; it needs CRIU_FAULT=130")
	}
	if NeedsNoBreakpointsWorkaround(40201) {
		t.Error("CRIU 4.2.1 detects broken breakpoints itself")
	}
	r := &Result{Version: 40101}
	if env := r.Env(); len(env) != 1 || env[0] != "CRIU_FAULT=130" {
		t.Errorf("env %v", env)
	}
}

func TestLastErrors(t *testing.T) {
	out := "Warn (a): x\nError (criu/cr-check.c:1): boom\nLooks bad.\n"
	if got := lastErrors(out); got != "Error (criu/cr-check.c:1): boom" {
		t.Errorf("got %q", got)
	}
}
