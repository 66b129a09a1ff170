//go:build !windows

package agent

import (
	"os"
	"path/filepath"
)

// DefaultDataDir is where the agent keeps its identity and state:
// /var/lib/edgebox-agent for root, the user's config directory otherwise.
func DefaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/edgebox-agent"
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "edgebox", "agent")
	}
	return filepath.Join(os.TempDir(), "edgebox-agent")
}
