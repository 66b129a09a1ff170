//go:build (!unix || aix) && !windows

package filelock

import (
	"errors"
	"os"
)

// tryLock fails: this system has no lock this package trusts across
// processes.
func tryLock(*os.File) error { return errors.ErrUnsupported }

func unlock(*os.File) error { return errors.ErrUnsupported }
