// Package atomicfile writes files so that a crash leaves either the old
// content or the new, never a torn file.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes b to path with mode 0600 through a synced temporary file in
// the same directory, renamed over path.
func Write(path string, b []byte) error { return WriteMode(path, b, 0o600) }

// WriteMode is Write with the file's mode.
func WriteMode(path string, b []byte, mode os.FileMode) error { return write(path, b, mode, true) }

// WriteUnsynced is Write without the sync, for a file rewritten often and
// made anew at every start, such as a status report: a crash still leaves
// the old content or the new, but a power loss may leave the file empty.
func WriteUnsynced(path string, b []byte) error { return write(path, b, 0o600, false) }

func write(path string, b []byte, mode os.FileMode, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
