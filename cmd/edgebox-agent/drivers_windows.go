package main

import (
	"log/slog"

	"github.com/edgebox/edgebox/agent/runtime"
)

// drivers returns the runtimes of a Windows box: native programs, each in
// a job object of its own, and VMs when QEMU is installed (on PATH).
func drivers(dataDir string, rt runtimeFlags, log *slog.Logger) ([]runtime.Driver, []beside, func()) {
	ds, _ := hostDrivers(dataDir, rt, nil, nil, log)
	return ds, nil, func() {}
}
