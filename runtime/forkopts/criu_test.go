package forkopts

import (
	"strings"
	"testing"
)

func TestPodmanRestoreFlags(t *testing.T) {
	flags, missing := Dumped{TCPEstablished: true, FileLocks: true, ShellJob: true}.PodmanRestoreFlags()
	if strings.Join(flags, " ") != "--tcp-established --file-locks" || strings.Join(missing, " ") != "shell-job" {
		t.Errorf("flags %v, missing %v", flags, missing)
	}
	flags, missing = Dumped{TCPClose: true, ExtUnixSk: true}.PodmanRestoreFlags()
	if len(flags) != 0 || strings.Join(missing, " ") != "ext-unix-sk tcp-close" {
		t.Errorf("flags %v, missing %v", flags, missing)
	}
}
