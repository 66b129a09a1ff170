//go:build !windows

package main

import (
	"fmt"
	"os"
	"syscall"
)

// reexec replaces this process with the installed binary run again with
// the same arguments; it returns only if that fails.
func reexec() {
	self, err := os.Executable()
	if err == nil {
		err = syscall.Exec(self, os.Args, os.Environ())
	}
	fmt.Fprintln(os.Stderr, "edgebox-agent: starting again as the launcher:", err)
}
