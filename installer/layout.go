// Package installer installs the edgebox agent on a box as a service: the
// binary in the standard place for the OS, the box enrolled, a systemd
// unit (or a SysV script where there is no systemd) or a Windows service
// with recovery actions, started and watched until the box is online.
package installer

import (
	"runtime"
)

// ServiceName is the agent's service name on every OS.
const ServiceName = "edgebox-agent"

// Layout is where an installed agent lives.
type Layout struct {
	// Bin is the installed agent binary.
	Bin string
	// DataDir holds the box's identity, keys, state and settings.
	DataDir string
	// LogDir receives the service's output where the init system does not
	// keep it (SysV).
	LogDir string
}

// DefaultLayout returns the standard places for this OS.
func DefaultLayout() Layout { return layoutFor(runtime.GOOS) }

func layoutFor(goos string) Layout {
	if goos == "windows" {
		return Layout{
			Bin:     `C:\Program Files\edgebox\edgebox-agent.exe`,
			DataDir: `C:\ProgramData\edgebox\agent`,
			LogDir:  `C:\ProgramData\edgebox\logs`,
		}
	}
	return Layout{Bin: "/usr/local/bin/edgebox-agent", DataDir: "/var/lib/edgebox-agent", LogDir: "/var/log"}
}
