// Package atomicfile replaces files whole: a reader sees the old content or
// the new, never a part, and a writer that dies midway leaves the old file.
// ReadJSON reads back what WriteJSON wrote.
// The data goes to a temporary file beside the target, renamed over it once
// complete. Nothing is synced: tclone's state lives on tmpfs, and a record
// that a power loss takes away is gone with the processes it described.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with data, with permissions perm.
// Concurrent writers each write their own temporary file; the last rename
// wins.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	// The temporary name keeps the target's name as a prefix, so that a
	// directory scan by suffix (*.json) never takes it for the real file.
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// WriteJSON replaces the file at path with v as indented JSON.
func WriteJSON(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFile(path, append(data, '\n'), perm)
}

// ReadJSON decodes the JSON file at path into v. A missing file is an
// error that wraps os.ErrNotExist; one that does not decode is an error
// that names the file.
func ReadJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	return nil
}
