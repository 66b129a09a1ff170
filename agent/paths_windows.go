package agent

import (
	"os"
	"path/filepath"
)

// DefaultDataDir is where the agent keeps its identity and state.
func DefaultDataDir() string {
	base := os.Getenv("ProgramData")
	if base == "" {
		base = `C:\ProgramData`
	}
	return filepath.Join(base, "edgebox", "agent")
}
