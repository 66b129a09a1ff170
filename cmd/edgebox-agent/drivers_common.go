//go:build linux || windows

package main

import (
	"log/slog"
	"path/filepath"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
)

// hostDrivers are the runtimes of Linux and Windows boxes alike: native
// programs always, VMs when QEMU is installed.
func hostDrivers(dataDir string, log *slog.Logger) (ds []runtime.Driver) {
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
	return ds
}
