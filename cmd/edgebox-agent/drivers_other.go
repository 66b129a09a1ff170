//go:build !linux && !windows

package main

import (
	"log/slog"

	"github.com/edgebox/edgebox/agent/runtime"
)

// drivers: edgebox runs workloads on Linux and Windows only.
func drivers(string, runtimeFlags, *slog.Logger) ([]runtime.Driver, []beside, func()) {
	return nil, nil, func() {}
}
