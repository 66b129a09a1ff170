//go:build windows

package session

import (
	"os"
	"path/filepath"
)

// hostShell is the box's command interpreter.
func hostShell() []string {
	if c := os.Getenv("ComSpec"); c != "" {
		return []string{c}
	}
	return []string{filepath.Join(os.Getenv("SystemRoot"), "System32", "cmd.exe")}
}

// hostEnv is the agent's own environment, and the system drive's root.
func hostEnv() ([]string, string) {
	dir := os.Getenv("SystemDrive") + `\`
	if dir == `\` {
		dir = `C:\`
	}
	return os.Environ(), dir
}
