package branch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// An image record notes a checkpoint image this host wrote of a branch
// (podman container branch export --image): the image's ID and what each
// file of its layer held. A later export of a branch of the same source
// writes only what changed over such an image (a layer on top of it), and
// trusts what the record says the image holds, never what the image's own
// labels claim. Records live in the branch's directory and go with it.
//
//	<Dir>/branches/<id>/images/<image id>.json
type ImageRecord struct {
	ImageID string `json:"image_id"`
	// Files are the layer's files by slash-separated path: their SHA-256,
	// or "" for page images (whose bytes the branch's plan files are).
	Files map[string]string `json:"files"`
}

var imageIDRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ErrNoImageRecord: the branch has no record of that image.
var ErrNoImageRecord = errors.New("no record of the image")

func (s Store) imageRecordPath(b *Branch, imageID string) (string, error) {
	if !imageIDRE.MatchString(imageID) {
		return "", fmt.Errorf("image ID %q is not 64 hexadecimal digits", imageID)
	}
	return s.Path(b, filepath.Join("images", imageID+".json")), nil
}

// RecordImage keeps rec with branch b.
func (s Store) RecordImage(b *Branch, rec *ImageRecord) error {
	path, err := s.imageRecordPath(b, rec.ImageID)
	if err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ImageRecord is branch b's record of image imageID (ErrNoImageRecord if
// it has none).
func (s Store) ImageRecord(b *Branch, imageID string) (*ImageRecord, error) {
	path, err := s.imageRecordPath(b, imageID)
	if err != nil {
		return nil, err
	}
	data, err := readBounded(path, maxManifestBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoImageRecord
	}
	if err != nil {
		return nil, err
	}
	var rec ImageRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("branch %s's record of image %s: %w", b.Name, imageID, err)
	}
	if rec.ImageID != imageID {
		return nil, fmt.Errorf("branch %s's record of image %s names image %s", b.Name, imageID, rec.ImageID)
	}
	return &rec, nil
}
