package criuhooks

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/stats"
)

// The statistics CRIU writes into its working directory (its cwd). They are
// read through crit, whose image registry go-criu's separate stats package
// would collide with.

// DumpStats reads stats-dump from a CRIU work directory.
func DumpStats(workDir string) (*stats.DumpStatsEntry, error) {
	st, err := readStats(filepath.Join(workDir, "stats-dump"))
	if err != nil {
		return nil, err
	}
	if st.GetDump() == nil {
		return nil, fmt.Errorf("%s/stats-dump holds no dump statistics", workDir)
	}
	return st.GetDump(), nil
}

// RestoreStats reads stats-restore from a CRIU work directory.
func RestoreStats(workDir string) (*stats.RestoreStatsEntry, error) {
	st, err := readStats(filepath.Join(workDir, "stats-restore"))
	if err != nil {
		return nil, err
	}
	if st.GetRestore() == nil {
		return nil, fmt.Errorf("%s/stats-restore holds no restore statistics", workDir)
	}
	return st.GetRestore(), nil
}

func readStats(path string) (*stats.StatsEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(&stats.StatsEntry{})
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if len(img.Entries) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	st, ok := img.Entries[0].Message.(*stats.StatsEntry)
	if !ok {
		return nil, fmt.Errorf("%s: unexpected entry type", path)
	}
	return st, nil
}
