package branch

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestImageRecordsGoWithTheirBranch(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	b := create(t, s, "first", map[string][]byte{"images/core-1.img": []byte("core")})
	id := strings.Repeat("ab", 32)
	if _, err := s.ImageRecord(b, id); !errors.Is(err, ErrNoImageRecord) {
		t.Fatalf("a record never made: %v", err)
	}
	rec := &ImageRecord{ImageID: id, Files: map[string]string{"checkpoint/core-1.img": strings.Repeat("0", 64), "checkpoint/pages-1.img": ""}}
	if err := s.RecordImage(b, rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.ImageRecord(b, id)
	if err != nil || !reflect.DeepEqual(got, rec) {
		t.Fatalf("read back %+v, %v; wrote %+v", got, err, rec)
	}
	// A name that is no image ID never becomes a path.
	for _, bad := range []string{"../../x", "", strings.Repeat("AB", 32)} {
		if _, err := s.ImageRecord(b, bad); err == nil || errors.Is(err, ErrNoImageRecord) {
			t.Errorf("image ID %q: %v", bad, err)
		}
		if err := s.RecordImage(b, &ImageRecord{ImageID: bad}); err == nil {
			t.Errorf("recorded image ID %q", bad)
		}
	}
	// Another branch has no record of it; removing the branch removes it.
	other := create(t, s, "second", map[string][]byte{"images/core-1.img": []byte("core 2")})
	if _, err := s.ImageRecord(other, id); !errors.Is(err, ErrNoImageRecord) {
		t.Fatalf("another branch's record: %v", err)
	}
	if _, err := s.Remove("first"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path(b, "images")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the removed branch's records: %v", err)
	}
}
