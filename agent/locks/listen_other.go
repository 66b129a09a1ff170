//go:build !windows

package locks

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// Listen listens for the local API on the unix socket agent.sock in dir,
// which is made if needed. The directory is what containers get mounted
// (at /run/edgebox), so a socket made again after a restart of the agent
// is there for them too. Any user of the box may connect: workloads run
// as users of their own.
func Listen(dir string) (net.Listener, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "agent.sock")
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("local API: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, "", fmt.Errorf("local API: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("local API: %w", err)
	}
	return ln, Address(dir), nil
}

// Address is the local API's address when it listens in dir.
func Address(dir string) string { return "unix://" + filepath.Join(dir, "agent.sock") }
