//go:build linux || windows

package main

import (
	"log/slog"
	"path/filepath"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
)

// hostDrivers are the runtimes of Linux and Windows boxes alike: native
// programs always, VMs when QEMU is installed (vms), on the workload
// network net with the egress policies egress when the box has them
// (Linux).
func hostDrivers(dataDir string, rt runtimeFlags, net *qemu.Network, egress *qemu.EgressPolicies, log *slog.Logger) (ds []runtime.Driver, vms *qemu.Driver) {
	if p, err := process.New(process.Config{StateDir: filepath.Join(dataDir, "process"), FirstUID: rt.firstUID,
		AgentAPI: agent.APIAddress(dataDir)}); err == nil {
		ds = append(ds, p)
	} else {
		log.Warn("native process workloads cannot run", "err", err)
	}
	if q, err := qemu.New(qemu.Config{StateDir: filepath.Join(dataDir, "qemu"), Accel: rt.vmAccel, Network: net, Egress: egress, Log: log}); err == nil {
		log.Info("VMs run with QEMU", "accel", q.Accel())
		ds, vms = append(ds, q), q
	} else {
		log.Info("VM workloads cannot run", "err", err)
	}
	return ds, vms
}
