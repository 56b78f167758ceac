// Package imagetest writes and reads CRIU images for tests.
package imagetest

import (
	"os"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"google.golang.org/protobuf/proto"
)

// Write writes an image with magic and one entry per message at path.
func Write(t *testing.T, path, magic string, msgs ...proto.Message) {
	t.Helper()
	img := &crit.CriuImage{Magic: magic}
	for _, m := range msgs {
		img.Entries = append(img.Entries, &crit.CriuEntry{Message: m})
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		t.Fatal(err)
	}
}
