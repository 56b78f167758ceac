package criuhooks

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
)

// The twin plugin's sources, in the order hack/build-criu.sh hashes them
// for the second line of its stamp.
//
//go:embed criu/twin.c criu/twin.h criu/tramp.S criu/Makefile
var pluginSources embed.FS

var pluginSourceOrder = []string{"criu/twin.c", "criu/twin.h", "criu/tramp.S", "criu/Makefile"}

// TwinPluginStamp is the stamp hack/build-criu.sh gives a twin plugin built
// from this tclone's sources: the first 16 hex digits of the SHA-256 of
// the sources, one after another. A plugin with another stamp may speak
// another version of the plugin's messages, or park twins another way.
func TwinPluginStamp() string {
	h := sha256.New()
	for _, name := range pluginSourceOrder {
		b, err := pluginSources.ReadFile(name)
		if err != nil {
			panic(err) // embedded: cannot fail
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
