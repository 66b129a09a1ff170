package main

import (
	"log/slog"
	"path/filepath"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
)

// drivers returns the runtimes of a Windows box: native programs, each in
// a job object of its own, and VMs when QEMU is installed (on PATH).
func drivers(dataDir string, _ runtimeFlags, log *slog.Logger) (ds []runtime.Driver, closeAll func()) {
	if p, err := process.New(process.Config{StateDir: filepath.Join(dataDir, "process")}); err == nil {
		ds = append(ds, p)
	} else {
		log.Warn("native process workloads cannot run", "err", err)
	}
	if q, err := qemu.New(qemu.Config{StateDir: filepath.Join(dataDir, "qemu")}); err == nil {
		log.Info("VMs run with QEMU", "accel", q.Accel())
		ds = append(ds, q)
	} else {
		log.Info("VM workloads cannot run", "err", err)
	}
	return ds, func() {}
}
