package forkopts

import "testing"

func TestSizeText(t *testing.T) {
	for in, want := range map[string]Size{
		"0": 0, "": 0, "1048576": MiB, "512k": 512 * KiB, "512K": 512 * KiB, "64M": 64 * MiB, "64MiB": 64 * MiB,
		"64mb": 64 * MiB, "2G": 2 * GiB, "3b": 3, " 1g ": GiB,
	} {
		var s Size
		if err := s.UnmarshalText([]byte(in)); err != nil || s != want {
			t.Errorf("%q: %d, %v; want %d", in, s, err, want)
		}
		var back Size
		if err := back.UnmarshalText([]byte(s.String())); err != nil || back != s {
			t.Errorf("%q: written as %q, read back as %d, %v", in, s.String(), back, err)
		}
	}
	for _, in := range []string{"M", "-1M", "1.5M", "1T", "1kk", "1bi", "64 M", "x", "99999999999G"} {
		var s Size
		if err := s.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q read as %d, want an error", in, s)
		}
	}
	if got := (64 * MiB).String(); got != "64M" {
		t.Errorf("64 MiB is written %q", got)
	}
	if got := Size(1000).String(); got != "1000" {
		t.Errorf("1000 bytes are written %q", got)
	}
}
