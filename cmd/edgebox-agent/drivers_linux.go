package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/containerd"
)

// drivers returns the runtimes this box has: native processes always, VMs
// when QEMU is installed, containerd when its socket is there. A box
// without containerd runs no containers and says so in each container
// workload's status.
func drivers(dataDir string, rt runtimeFlags, log *slog.Logger) (ds []runtime.Driver, side []beside, closeAll func()) {
	containerdAddr := rt.containerd
	closeAll = func() {}
	// Native workloads run as users of their own and reach their homes
	// under the data directory: they may pass it, not list it (the box's
	// key and database stay 0600).
	if err := os.Chmod(dataDir, 0o711); err != nil {
		log.Warn("data directory", "err", err)
	}
	// One network and one set of egress policies for containers and VMs:
	// the containerd driver sweeps them at start, keeping what the qemu
	// driver holds.
	net := workloadNetwork(dataDir, log)
	egress := egressPolicies(net, log)
	if egress != nil {
		side = append(side, beside{"egress policies", egress.Run})
	}
	ds, vms := hostDrivers(dataDir, rt, net, egress, log)
	var keepVMs func(string) bool
	if vms != nil {
		keepVMs = vms.HoldsNetwork
	}
	if _, err := os.Stat(containerdAddr); err != nil {
		log.Info("no containerd on this box; container workloads cannot run", "socket", containerdAddr)
		return ds, side, closeAll
	}
	d, err := containerd.New(containerd.Config{Address: containerdAddr, LogDir: filepath.Join(dataDir, "logs"),
		VolumeDir: agent.VolumeDir(dataDir), RuncRoot: rt.runcRoot, AgentAPIDir: agent.APIDir(dataDir),
		Network: net, Egress: egress, KeepNetwork: keepVMs, StateDir: filepath.Join(dataDir, "containerd"), Proxy: rt.proxy, Log: log})
	if err != nil {
		log.Warn("containerd is not usable; container workloads cannot run", "err", err)
		return ds, side, closeAll
	}
	return append(ds, d), side, func() { d.Close() }
}

// egressPolicies enforce the releases' egress policies on the workload
// network's bridge; nil without a network (workloads whose release
// restricts egress are then refused).
func egressPolicies(net *network.Network, log *slog.Logger) *network.Policies {
	if net == nil {
		return nil
	}
	cfg := network.DefaultEgressConfig()
	cfg.Bridge = net.Config().Bridge
	p, err := network.NewPolicies(cfg, log)
	if err != nil {
		log.Warn("egress policies cannot be enforced: workloads whose release restricts egress do not run", "err", err)
		return nil
	}
	return p
}

// workloadNetwork is edgebox's bridge for workloads, its state under the
// data directory; nil, said once in the log, when the box lacks the CNI
// plugins: containers then get loopback only and publish no ports.
func workloadNetwork(dataDir string, log *slog.Logger) *network.Network {
	cfg := network.DefaultConfig()
	cfg.StateDir = filepath.Join(dataDir, "network")
	n, err := network.New(cfg, log)
	if err != nil {
		log.Warn("workloads get no network: containers have loopback only and cannot publish ports", "err", err)
		return nil
	}
	log.Info("workload network", "network", cfg.String())
	return n
}
