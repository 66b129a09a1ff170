//go:build !linux

package main

import (
	"log/slog"

	"github.com/edgebox/edgebox/agent/runtime"
)

// drivers returns the runtimes this box has; the process and QEMU drivers
// for Windows come with their own changes.
func drivers(string, runtimeFlags, *slog.Logger) ([]runtime.Driver, func()) { return nil, func() {} }
