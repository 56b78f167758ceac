package forkopts

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a number of bytes, given as a number with an optional binary
// suffix: 1048576, 512k, 64M, 1G (k, M and G are 1024, 1024² and 1024³;
// KiB, MB and the like are read the same).
type Size int64

// Binary multiples a Size's suffix names.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
)

// MarshalText writes the size with the largest suffix that divides it; a
// zero Size, which stands for a default, as nothing.
func (s Size) MarshalText() ([]byte, error) {
	if s == 0 {
		return nil, nil
	}
	for _, u := range []struct {
		unit   Size
		suffix string
	}{{GiB, "G"}, {MiB, "M"}, {KiB, "k"}} {
		if s%u.unit == 0 {
			return []byte(strconv.FormatInt(int64(s/u.unit), 10) + u.suffix), nil
		}
	}
	return []byte(strconv.FormatInt(int64(s), 10)), nil
}

// UnmarshalText reads a size as MarshalText writes it, or with a longer
// suffix (64MiB, 64MB).
func (s *Size) UnmarshalText(b []byte) error {
	text := strings.TrimSpace(string(b))
	if text == "" {
		*s = 0 // the default
		return nil
	}
	num := strings.TrimRight(text, "kKmMgGiIbB")
	suffix := strings.ToLower(text[len(num):])
	unit := Size(1)
	switch strings.TrimSuffix(strings.TrimSuffix(suffix, "b"), "i") {
	case "":
		if suffix != "" && suffix != "b" {
			return fmt.Errorf("size %q: give bytes, or a number with k, M or G", text)
		}
	case "k":
		unit = KiB
	case "m":
		unit = MiB
	case "g":
		unit = GiB
	default:
		return fmt.Errorf("size %q: give bytes, or a number with k, M or G", text)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > int64((1<<62)/unit) {
		return fmt.Errorf("size %q: give bytes, or a number with k, M or G", text)
	}
	*s = Size(n) * unit
	return nil
}

// String is MarshalText's text.
func (s Size) String() string {
	b, _ := s.MarshalText()
	return string(b)
}
