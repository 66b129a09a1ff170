package main

import (
	"log/slog"
	"path/filepath"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
)

// drivers returns the runtimes of a Windows box: native programs, each in
// a job object of its own.
func drivers(dataDir string, _ runtimeFlags, log *slog.Logger) ([]runtime.Driver, func()) {
	p, err := process.New(process.Config{StateDir: filepath.Join(dataDir, "process")})
	if err != nil {
		log.Warn("native process workloads cannot run", "err", err)
		return nil, func() {}
	}
	return []runtime.Driver{p}, func() {}
}
